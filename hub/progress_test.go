package hub

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/hub/hubtest"
)

func TestProgressOutput(t *testing.T) {
	srv := hubtest.New(t)
	files := modelFiles(80, 250_000)
	srv.AddRepo(testRepo, hubtest.Public).Commit("main", files...)
	ctx := context.Background()

	var out bytes.Buffer
	c := newTestClient(t, srv)
	if _, err := c.Download(ctx, testRepo, DownloadOptions{Progress: &out}); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for path := range wantedFiles(files) {
		if !strings.Contains(text, "  "+path+" (") {
			t.Errorf("progress lacks a line for %s:\n%s", path, text)
		}
	}
	if !strings.Contains(text, "model.safetensors (250.0 kB)") {
		t.Errorf("progress does not show the weights' size:\n%s", text)
	}
	if !strings.Contains(text, testRepo+"@main (") || !strings.Contains(text, "7 files") {
		t.Errorf("progress lacks the summary line:\n%s", text)
	}
	if strings.Contains(text, "\r") {
		t.Errorf("carriage returns written to a non-terminal:\n%q", text)
	}

	// A second run finds everything cached and says so.
	out.Reset()
	if _, err := c.Download(ctx, testRepo, DownloadOptions{Progress: &out}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "model.safetensors (250.0 kB, cached)") {
		t.Errorf("second run does not report cached files:\n%s", out.String())
	}

	out.Reset()
	if _, err := newTestClient(t, srv).Download(ctx, testRepo, DownloadOptions{Progress: &out, Quiet: true}); err != nil {
		t.Fatal(err)
	}
	if out.Len() != 0 {
		t.Errorf("quiet mode wrote %q", out.String())
	}
}

func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 999: "999 B", 1000: "1.0 kB", 250_000: "250.0 kB", 1_500_000: "1.5 MB", 8_050_000_000: "8.1 GB"} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestProgressBarRedrawsOneLine(t *testing.T) {
	var out bytes.Buffer
	size := int64(2_000_000)
	p := newProgress(&out, "org/model@main", []Sibling{{RFilename: "model.safetensors", Size: &size}, {RFilename: "config.json"}})
	p.tty = true // as if out were a terminal
	p.learnSize("config.json", 1000)
	p.add(1_000_500)
	p.fileDone("config.json", false)
	p.mu.Lock()
	p.drawLocked()
	p.mu.Unlock()
	p.add(1_000_500)
	p.fileDone("model.safetensors", false)
	p.finish(nil)
	text := out.String()
	for _, want := range []string{"\rorg/model@main [", "50%", "1.0 MB/2.0 MB", "1/2 files", "100%", "2/2 files"} {
		if !strings.Contains(text, want) {
			t.Errorf("bar output lacks %q:\n%q", want, text)
		}
	}
	// A terminal bar redraws in place: the only newline is the one finish ends it with.
	if strings.Count(text, "\n") != 1 || !strings.HasSuffix(text, "\n") {
		t.Errorf("bar output breaks lines:\n%q", text)
	}
}
