package wording

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// workSession matches text that counts measurements by the sitting they were made in
// ("session 16", "session-15 results", "sessions 5–13", a folder named "…-session4") or
// by the machine's loan ("lease", "earlier leases"). Chat, HTTP and CLI sessions never
// carry a number, and "release" or "please" are other words.
var workSession = []*regexp.Regexp{
	regexp.MustCompile(`(?i)\bsessions?[ _-]?[0-9]+`),
	regexp.MustCompile(`(?i)\bleas(e|es|ed|ing)\b`),
}

// sittingPhrase matches the same narration without a number ("this session's defaults",
// "for the next GPU session"). cli/ and server/ are left out of it: there "this session"
// can be the CLI's loaded model (cli.Session) or a client's connection.
var sittingPhrase = regexp.MustCompile(`(?i)\b(this|that|next|last|previous|earlier|later|first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|gpu|work)\s+sessions?\b`)

// allowed are exact recorded values that match workSession but name no sitting of ours:
// runs recorded their settings as run, and DFLASH_TC_RULE once accepted a rule named so.
var allowed = map[string][]string{
	".env": {"DFLASH_TC_RULE=session3"},
}

// skipped are trees whose text is not ours, this package, whose tests must spell out
// what they look for, and the trained pair's vocabulary, whose tokens are pieces of Go
// source ("lease" from "release") rather than prose.
var skipped = []string{"third_party/", "server/sdktest/node_modules/", "internal/wording/", "testdata/gocode/target/tokenizer.json"}

func TestNoWorkSessionWording(t *testing.T) {
	root, files := trackedFiles(t)
	badPaths := map[string]bool{}
	for _, name := range files {
		if skip(name) {
			continue
		}
		if dir := badPath(name); dir != "" && !badPaths[dir] {
			badPaths[dir] = true
			t.Errorf("%s: the name counts work by sitting; name it by date and commit", dir)
		}
		data, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			if os.IsNotExist(err) {
				continue // deleted in the working tree, not yet in the index
			}
			t.Fatal(err)
		}
		if bytes.IndexByte(data, 0) >= 0 {
			continue // binary
		}
		for i, line := range strings.Split(string(data), "\n") {
			line = allow(name, line)
			for _, re := range workSession {
				if m := re.FindString(line); m != "" {
					t.Errorf("%s:%d: %q counts work by sitting or loan; cite the date, commit and results file instead (docs/perf/)", name, i+1, m)
				}
			}
			if strings.HasPrefix(name, "cli/") || strings.HasPrefix(name, "server/") {
				continue
			}
			if m := sittingPhrase.FindString(line); m != "" {
				t.Errorf("%s:%d: %q counts work by sitting; cite the date, commit and results file instead (docs/perf/)", name, i+1, m)
			}
		}
	}
}

// TestPatterns keeps the patterns precise: they find the narration and leave the other
// meanings of the words alone.
func TestPatterns(t *testing.T) {
	hits := []string{
		"DFlash 1 387 tok/s in session 16", "session-15 results", "sessions 5–13 had it off",
		"bench/results/h200-2026-12-01-session16/", "earlier leases", "of each lease",
		"in one lease", "Session 4 found", "since session 3",
	}
	for _, s := range hits {
		if !matchesAny(s) {
			t.Errorf("%q: not found", s)
		}
	}
	phrases := []string{"this session's defaults", "For the next GPU session", "the first session"}
	for _, s := range phrases {
		if !sittingPhrase.MatchString(s) {
			t.Errorf("%q: not found", s)
		}
	}
	misses := []string{
		"Session is a loaded target (+ drafter)", "chatSession is the REPL state", "cli/session.go",
		"Free releases the kernel", "Quick answer please", "CMAKE_BUILD_TYPE Release",
		"the release check is 32 × 60", "the session logs records", "(*Session).Generate",
		"DFLASH_TC_RULE=session3",
	}
	for _, s := range misses {
		if matchesAny(allow("x/ab_2.env", s)) || sittingPhrase.MatchString(s) {
			t.Errorf("%q: matched", s)
		}
	}
}

// badPath returns the leading part of name up to the first path element that matches
// workSession ("bench/results/h200-2026-12-01-session16"), or "".
func badPath(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		if matchesAny(p) {
			return strings.Join(parts[:i+1], "/")
		}
	}
	return ""
}

func matchesAny(s string) bool {
	for _, re := range workSession {
		if re.MatchString(s) {
			return true
		}
	}
	return false
}

// allow blanks the allowed values for name's kind of file.
func allow(name, line string) string {
	for ext, values := range allowed {
		if strings.HasSuffix(name, ext) {
			for _, v := range values {
				line = strings.ReplaceAll(line, v, "")
			}
		}
	}
	return line
}

func skip(name string) bool {
	for _, p := range skipped {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// trackedFiles lists the files git tracks, from the repository root; without git or a
// checkout there is nothing to check.
func trackedFiles(t *testing.T) (root string, files []string) {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	cmd := exec.Command("git", "ls-files", "-z")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("git ls-files in %s: %v (not a checkout)", root, err)
	}
	for _, f := range strings.Split(string(out), "\x00") {
		if f != "" {
			files = append(files, f)
		}
	}
	if len(files) == 0 {
		t.Skip("no tracked files")
	}
	return root, files
}
