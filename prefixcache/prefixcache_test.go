package prefixcache

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
)

// do runs fn on the MLX thread.
func do(t *testing.T, fn func()) {
	t.Helper()
	if err := mlxc.Do(func() error { return mlxc.Catch(fn) }); err != nil {
		t.Fatal(err)
	}
}

// kvState is a KV layer's saved state of n rows whose values encode (seed, row).
func kvState(n int, seed float32) cache.Saved {
	s := cache.Saved{Kind: "kv", Offset: n, Trimmable: true}
	if n == 0 {
		return s
	}
	for j := range 2 {
		v := make([]float32, 2*n*4)
		for i := range v {
			v[i] = seed + float32(j) + float32(i)/1000
		}
		a := mlxc.AsType(mlxc.FromSlice(v, 1, 2, n, 4), mlxc.BFloat16)
		mlxc.Eval(a)
		s.Arrays = append(s.Arrays, a.Detach())
	}
	return s
}

// recState is a recurrent layer's saved state after n positions.
func recState(n int, seed float32) cache.Saved {
	st := make([]float32, 2*4*32)
	for i := range st {
		st[i] = seed + float32(n) + float32(i)/100
	}
	a := mlxc.FromSlice(st, 1, 2, 4, 32)
	b := mlxc.AsType(mlxc.FromSlice(make([]float32, 3*8), 1, 3, 8), mlxc.BFloat16)
	mlxc.Eval(a, b)
	return cache.Saved{Kind: "recurrent", Offset: n, Arrays: []*mlxc.Array{a.Detach(), b.Detach()}}
}

// entry makes an entry for tokens: a KV layer, and with recurrent a recurrent layer with
// marks at the given positions; with draft a drafter layer.
func entry(tokens []int32, recurrent bool, draft bool, marks ...int) *Entry {
	n := len(tokens)
	e := &Entry{Tokens: append([]int32(nil), tokens...), Target: []cache.Saved{kvState(n, 1)}}
	if recurrent {
		e.Target = append(e.Target, recState(n, 2))
		for _, p := range marks {
			e.Marks = append(e.Marks, Mark{Pos: p, Target: []cache.Saved{{}, recState(p, 2)}})
		}
	}
	if draft {
		e.Draft = []cache.Saved{kvState(n, 3)}
	}
	return e
}

func seq(n int, from int32) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = from + int32(i)
	}
	return out
}

// Lookup finds the longest prefix an entry resumes at: any position of a KV-only entry,
// the end or a mark of one with a recurrent layer; the limit and the drafter's need are
// honoured; the loaded states are the entry's at that position.
func TestLookupLongestPrefix(t *testing.T) {
	do(t, func() {
		c, err := New(Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Free()
		c.Insert(entry(seq(20, 0), false, true))
		c.Insert(entry(seq(12, 100), true, false, 4, 8))
		branch := append(seq(6, 100), 7, 7, 7, 7, 7, 7, 7, 7)
		for _, tc := range []struct {
			name      string
			prompt    []int32
			limit     int
			needDraft bool
			want      int
		}{
			{"kv whole entry", seq(30, 0), 29, true, 20},
			{"kv limit", seq(30, 0), 9, true, 9},
			{"kv diverges", append(seq(7, 0), 99, 99), 8, true, 7},
			{"nothing in common", []int32{55, 56}, 1, false, 0},
			{"recurrent end", seq(15, 100), 14, false, 12},
			{"recurrent mark", branch, 13, false, 4},
			{"recurrent mark at the limit", seq(15, 100), 8, false, 8},
			{"recurrent between marks", seq(15, 100), 7, false, 4},
			{"recurrent entry has no drafter context", seq(15, 100), 14, true, 0},
		} {
			h := c.Lookup(tc.prompt, tc.limit, tc.needDraft)
			got := 0
			if h != nil {
				got = h.N
				for i, s := range h.Target {
					if !s.CanResume(h.N) {
						t.Errorf("%s: layer %d saved at %d cannot resume at %d", tc.name, i, s.Offset, h.N)
					}
				}
				if tc.needDraft && (len(h.Draft) != 1 || !h.Draft[0].CanResume(h.N)) {
					t.Errorf("%s: drafter context %v", tc.name, h.Draft)
				}
				h.Release()
			}
			if got != tc.want {
				t.Errorf("%s: resumes at %d, want %d", tc.name, got, tc.want)
			}
		}
	})
}

// An entry that extends others takes their recurrent states as marks and replaces them;
// an entry that an existing one covers becomes a mark there: one entry per conversation,
// every position it served still served.
func TestInsertMergesCoveredEntries(t *testing.T) {
	do(t, func() {
		c, _ := New(Options{})
		defer c.Free()
		c.Insert(entry(seq(8, 0), true, true, 4))
		c.Insert(entry(seq(16, 0), true, true, 12))
		c.Insert(entry(seq(10, 0), true, true)) // covered: a mark at 10
		if st := c.Stats(); st.Entries != 1 || st.Bytes != c.lru.Front().Value.(*Entry).size() {
			t.Fatalf("stats %+v, want one entry holding its own bytes", st)
		}
		for _, n := range []int{4, 8, 10, 12, 16} {
			if h := c.Lookup(seq(30, 0), n, true); h == nil || h.N != n {
				t.Errorf("limit %d: hit %v", n, h)
			} else {
				if h.Target[1].Offset != n {
					t.Errorf("limit %d: recurrent state of position %d", n, h.Target[1].Offset)
				}
				h.Release()
			}
		}
		// A KV-only extension replaces its prefix outright.
		c.Insert(entry(seq(5, 500), false, false))
		c.Insert(entry(seq(9, 500), false, false))
		if st := c.Stats(); st.Entries != 2 {
			t.Errorf("%d entries, want 2", st.Entries)
		}
	})
}

// The bytes held never exceed the budget whatever is inserted, an entry larger than the
// budget is refused, and an entry in use (a hit not released) is never evicted: its
// arrays stay readable and equal to what was inserted.
func TestBudgetAndPins(t *testing.T) {
	do(t, func() {
		one := entry(seq(64, 0), false, false)
		per := one.size()
		one.free()
		var warns []string
		c, _ := New(Options{Budget: 3 * per, Warn: func(s string) { warns = append(warns, s) }})
		defer c.Free()
		rng := rand.New(rand.NewPCG(1, 2))
		c.Insert(entry(seq(64, 10000), false, false))
		pinned := c.Lookup(seq(64, 10000), 63, false)
		if pinned == nil {
			t.Fatal("no hit on the first entry")
		}
		want := pinned.Target[0].Arrays[0].Float32s()
		for i := range 200 {
			n := 1 + rng.IntN(160)
			c.Insert(entry(seq(n, int32(i*1000)), rng.IntN(2) == 0, rng.IntN(2) == 0, n/2))
			if h := c.Lookup(seq(n, int32(rng.IntN(i+1)*1000)), n-1, false); h != nil {
				h.Release()
			}
			if st := c.Stats(); st.Bytes > st.Budget || st.PeakBytes > st.Budget {
				t.Fatalf("insert %d: %d bytes held, peak %d, budget %d", i, st.Bytes, st.PeakBytes, st.Budget)
			}
		}
		if got := pinned.Target[0].Arrays[0].Float32s(); !cmp.Equal(got, want) {
			t.Fatal("the pinned entry's keys changed")
		}
		if h := c.Lookup(seq(64, 10000), 63, false); h == nil || h.N != 63 {
			t.Fatalf("the pinned entry was evicted: %v", h)
		} else {
			h.Release()
		}
		pinned.Release()
		st := c.Stats()
		if st.Evictions == 0 || st.Rejected == 0 {
			t.Errorf("stats %+v: want evictions and refusals (entries of up to 160 rows against a budget of 192)", st)
		}
		if len(warns) != 1 || !strings.Contains(warns[0], "larger than the cache's budget") {
			t.Errorf("warnings %q: want one about the entries larger than the budget", warns)
		}
	})
}

// openDisk opens a cache directory under root for key, collecting warnings.
func openDisk(t *testing.T, root, key string, warns *[]string) (*Cache, *Disk) {
	t.Helper()
	warn := func(s string) { *warns = append(*warns, s) }
	d, err := OpenDisk(root, key, 0, warn)
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Options{Disk: d, Warn: warn})
	if err != nil {
		t.Fatal(err)
	}
	return c, d
}

// Entries written through to disk are found by a new cache on the same directory (another
// process), with the same arrays bit for bit; an entry that extends another replaces its
// file.
func TestDiskRoundTrip(t *testing.T) {
	root := t.TempDir()
	do(t, func() {
		var warns []string
		c, _ := openDisk(t, root, "model-a", &warns)
		c.Insert(entry(seq(8, 0), true, true, 4))
		c.Insert(entry(seq(16, 0), true, true, 12))
		inRAM := c.Lookup(seq(20, 0), 19, true)
		want := [][]float32{inRAM.Target[0].Arrays[0].Float32s(), inRAM.Target[1].Arrays[0].Float32s(), inRAM.Draft[0].Arrays[1].Float32s()}
		inRAM.Release()
		c.Free()

		c2, d2 := openDisk(t, root, "model-a", &warns)
		defer c2.Free()
		if d2.Entries() != 1 {
			t.Errorf("%d files, want the one entry that covers both", d2.Entries())
		}
		h := c2.Lookup(seq(20, 0), 19, true)
		if h == nil || h.N != 16 {
			t.Fatalf("hit %v, want 16 positions from disk", h)
		}
		got := [][]float32{h.Target[0].Arrays[0].Float32s(), h.Target[1].Arrays[0].Float32s(), h.Draft[0].Arrays[1].Float32s()}
		h.Release()
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("arrays read back differ (-written +read):\n%s", d)
		}
		for _, n := range []int{4, 8, 12} {
			if h := c2.Lookup(seq(20, 0), n, true); h == nil || h.N != n {
				t.Errorf("mark %d not served after reading back: %v", n, h)
			} else {
				h.Release()
			}
		}
		if st := c2.Stats(); st.DiskHits != 1 || len(warns) != 0 {
			t.Errorf("stats %+v, warnings %v", st, warns)
		}
	})
}

// A changed byte anywhere in a file (magic, header, arrays, checksum), a truncated file or
// a file of another key is a miss with one warning, never an error or a wrong state.
func TestDiskDamagedOrForeignIsAMiss(t *testing.T) {
	root := t.TempDir()
	var path string
	do(t, func() {
		var warns []string
		c, d := openDisk(t, root, "model-a", &warns)
		c.Insert(entry(seq(8, 0), true, true, 4))
		c.Free()
		names, _ := filepath.Glob(filepath.Join(d.Dir(), "*"+fileExt))
		if len(names) != 1 {
			t.Fatalf("files %v", names)
		}
		path = names[0]
	})
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]func([]byte) []byte{
		"magic":     func(b []byte) []byte { b[0] ^= 1; return b },
		"version":   func(b []byte) []byte { b[len(fileMagic)] ^= 1; return b },
		"header":    func(b []byte) []byte { b[len(fileMagic)+12] ^= 0x20; return b },
		"arrays":    func(b []byte) []byte { b[len(b)-100] ^= 0x80; return b },
		"checksum":  func(b []byte) []byte { b[len(b)-1] ^= 1; return b },
		"truncated": func(b []byte) []byte { return b[:len(b)/2] },
		"empty":     func(b []byte) []byte { return nil },
	}
	for name, damage := range cases {
		t.Run(name, func(t *testing.T) {
			if err := os.WriteFile(path, damage(append([]byte(nil), good...)), 0o644); err != nil {
				t.Fatal(err)
			}
			do(t, func() {
				var warns []string
				// Opening checks every file: the damaged one is reported and removed.
				c, d := openDisk(t, root, "model-a", &warns)
				defer c.Free()
				if h := c.Lookup(seq(10, 0), 9, true); h != nil {
					t.Errorf("hit %d positions from a damaged file", h.N)
					h.Release()
				}
				if len(warns) != 1 || d.Entries() != 0 {
					t.Errorf("warnings %q, %d entries", warns, d.Entries())
				}
			})
		})
	}
	t.Run("damaged after opening", func(t *testing.T) {
		os.WriteFile(path, good, 0o644)
		do(t, func() {
			var warns []string
			c, _ := openDisk(t, root, "model-a", &warns)
			defer c.Free()
			b := append([]byte(nil), good...)
			b[len(b)-100] ^= 0x80
			os.WriteFile(path, b, 0o644)
			if h := c.Lookup(seq(10, 0), 9, true); h != nil {
				t.Errorf("hit %d positions from a damaged file", h.N)
				h.Release()
			}
			if len(warns) != 1 || !strings.Contains(warns[0], "checksum") {
				t.Errorf("warnings %q", warns)
			}
		})
	})
	t.Run("foreign", func(t *testing.T) {
		do(t, func() {
			var warns []string
			c, d := openDisk(t, root, "model-b", &warns)
			c.Free()
			os.WriteFile(filepath.Join(d.Dir(), filepath.Base(path)), good, 0o644)
			c, d = openDisk(t, root, "model-b", &warns)
			defer c.Free()
			if h := c.Lookup(seq(10, 0), 9, true); h != nil {
				t.Errorf("model-b resumed from model-a's entry")
				h.Release()
			}
			if len(warns) != 1 || !strings.Contains(warns[0], "another model") || d.Entries() != 0 {
				t.Errorf("warnings %q, %d entries", warns, d.Entries())
			}
		})
	})
}

// A process killed (SIGKILL) in the middle of writing an entry leaves no file that reads
// back as an entry: the write goes to a temporary name that only a finished, synced
// write renames.
func TestDiskKillDuringWrite(t *testing.T) {
	if os.Getenv("DFLASH_PREFIX_KILL_CHILD") != "" {
		return // the child's part is in TestMain
	}
	root := t.TempDir()
	marker := filepath.Join(root, "writing")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "DFLASH_PREFIX_KILL_CHILD="+root)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, err := os.Stat(marker); err == nil {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("the child never started writing")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	do(t, func() {
		var warns []string
		c, d := openDisk(t, root, "model-a", &warns)
		defer c.Free()
		tmps, _ := filepath.Glob(filepath.Join(d.Dir(), tmpPrefix+"*"))
		if len(tmps) != 1 {
			t.Errorf("temporary files %v, want the killed write's", tmps)
		}
		if h := c.Lookup(seq(4096, 0), 4095, true); h != nil || d.Entries() != 0 || len(warns) != 0 {
			t.Errorf("after the kill: hit %v, %d entries, warnings %q", h, d.Entries(), warns)
		}
	})
}

// TestMain runs the killed writer when asked: it writes one large entry to the directory
// named by DFLASH_PREFIX_KILL_CHILD, announcing the first bytes written and then waiting
// to be killed.
func TestMain(m *testing.M) {
	if root := os.Getenv("DFLASH_PREFIX_KILL_CHILD"); root != "" {
		err := mlxc.Do(func() error {
			d, err := OpenDisk(root, "model-a", 0, nil)
			if err != nil {
				return err
			}
			d.writeHook = func(n int64) {
				os.WriteFile(filepath.Join(root, "writing"), nil, 0o644)
				time.Sleep(time.Minute)
			}
			e := entry(seq(4096, 0), true, true, 1024)
			return d.write(e)
		})
		fmt.Fprintln(os.Stderr, "the child was not killed:", err)
		os.Exit(3)
	}
	os.Exit(m.Run())
}
