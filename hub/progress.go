package hub

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// progress shows one aggregate bar for a download. On a terminal it redraws a single line; on
// anything else (a log file, a test buffer) it writes one line per finished file and a summary,
// because carriage returns would garble those. A nil *progress is silent.
type progress struct {
	w     io.Writer
	tty   bool
	label string

	mu        sync.Mutex
	sizes     map[string]int64 // per file; -1 while unknown
	total     int64            // sum of known sizes
	done      int64            // bytes on disk so far
	files     int
	filesDone int
	start     time.Time
	lastWidth int

	stop chan struct{}
	wg   sync.WaitGroup
}

const redrawEvery = 150 * time.Millisecond

// newProgress starts a progress display for files on w; nil w gives a silent (nil) progress.
func newProgress(w io.Writer, label string, files []Sibling) *progress {
	if w == nil {
		return nil
	}
	p := &progress{w: w, tty: isTerminal(w), label: label, sizes: map[string]int64{}, files: len(files), start: time.Now(), stop: make(chan struct{})}
	for _, f := range files {
		size := f.size()
		p.sizes[f.RFilename] = size
		if size > 0 {
			p.total += size
		}
	}
	if p.tty {
		p.wg.Add(1)
		go p.redrawLoop()
	}
	return p
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// add counts bytes written (negative when a partial file is thrown away).
func (p *progress) add(n int64) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.done += n
	p.mu.Unlock()
}

// learnSize records a size the listing did not give.
func (p *progress) learnSize(name string, size int64) {
	if p == nil || size < 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if old, ok := p.sizes[name]; !ok || old < 0 {
		p.sizes[name] = size
		p.total += size
	}
}

// fileDone counts a finished file; cached files count their bytes as done without a transfer.
func (p *progress) fileDone(name string, cached bool) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.filesDone++
	size := p.sizes[name]
	if cached && size > 0 {
		p.done += size
	}
	if !p.tty {
		note := ""
		if cached {
			note = ", cached"
		}
		fmt.Fprintf(p.w, "  %s (%s%s)\n", name, humanBytes(max(size, 0)), note)
	}
}

// finish stops redrawing and prints the summary.
func (p *progress) finish(err error) {
	if p == nil {
		return
	}
	close(p.stop)
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		p.drawLocked()
		fmt.Fprintln(p.w)
	}
	elapsed := time.Since(p.start).Round(10 * time.Millisecond)
	if err != nil {
		fmt.Fprintf(p.w, "%s: stopped after %d of %d files (%s)\n", p.label, p.filesDone, p.files, elapsed)
		return
	}
	if !p.tty {
		fmt.Fprintf(p.w, "%s: %d files, %s in %s\n", p.label, p.files, humanBytes(p.total), elapsed)
	}
}

func (p *progress) redrawLoop() {
	defer p.wg.Done()
	tick := time.NewTicker(redrawEvery)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-tick.C:
			p.mu.Lock()
			p.drawLocked()
			p.mu.Unlock()
		}
	}
}

// drawLocked redraws the bar line in place.
func (p *progress) drawLocked() {
	elapsed := time.Since(p.start).Seconds()
	rate := 0.0
	if elapsed > 0 {
		rate = float64(p.done) / elapsed
	}
	pct := 0.0
	if p.total > 0 {
		pct = min(100, 100*float64(p.done)/float64(p.total))
	}
	const width = 24
	filled := int(pct / 100 * width)
	line := fmt.Sprintf("%s [%s%s] %3.0f%% %s/%s %s/s, %d/%d files",
		p.label, strings.Repeat("=", filled), strings.Repeat(" ", width-filled), pct,
		humanBytes(p.done), humanBytes(p.total), humanBytes(int64(rate)), p.filesDone, p.files)
	pad := max(0, p.lastWidth-len(line))
	fmt.Fprintf(p.w, "\r%s%s", line, strings.Repeat(" ", pad))
	p.lastWidth = len(line)
}

// humanBytes formats a byte count with decimal units, as the Hub's website and tqdm do.
func humanBytes(n int64) string {
	const unit = 1000
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %cB", float64(n)/float64(div), "kMGTPE"[exp])
}
