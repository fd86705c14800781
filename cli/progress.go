package cli

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// progressBar draws one redrawn line on a terminal, or a few plain lines elsewhere.
type progressBar struct {
	w     io.Writer
	label string
	tty   bool
	last  time.Time
	start time.Time
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func newProgressBar(w io.Writer, label string) *progressBar {
	return &progressBar{w: w, label: label, tty: isTerminal(w), start: time.Now()}
}

func (p *progressBar) update(done, total int64) {
	if !p.tty || time.Since(p.last) < 100*time.Millisecond && done < total {
		return
	}
	p.last = time.Now()
	frac := 0.0
	if total > 0 {
		frac = float64(done) / float64(total)
	}
	n := int(frac * 30)
	fmt.Fprintf(p.w, "\r%s [%s%s] %3.0f%% %s/%s", p.label, strings.Repeat("=", n), strings.Repeat(" ", 30-n), frac*100, human(done), human(total))
}

// fail ends the bar of a step that failed: it clears a drawn bar and reports nothing, the
// error that follows says what went wrong.
func (p *progressBar) fail() {
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K")
	}
}

func (p *progressBar) done() {
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K")
	}
	fmt.Fprintf(p.w, "%s: done in %.1fs\n", p.label, time.Since(p.start).Seconds())
}

func human(b int64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%dB", b)
	}
	div, exp := int64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(b)/float64(div), "KMGTPE"[exp])
}
