package store

import (
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
)

// progress reports a pull's layer downloads.
type progress interface {
	layer(digest string, size int64) layerProgress
	wait()
}

type layerProgress interface {
	wrap(r io.Reader) io.Reader
	done(fetched bool, err error)
}

// newProgress picks bars for a terminal and a line per layer for anything else.
func newProgress(w io.Writer, what string) progress {
	if w == nil {
		w = io.Discard
	}
	if f, ok := w.(*os.File); ok && isTerminal(f) {
		return &barProgress{p: mpb.New(mpb.WithOutput(f), mpb.WithWidth(40)), what: what}
	}
	return &lineProgress{w: w, what: what}
}

func shortDigest(d string) string {
	if len(d) > 7+12 {
		return d[7 : 7+12]
	}
	return d
}

func humanSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// lineProgress writes one line per layer, when it is done.
type lineProgress struct {
	mu   sync.Mutex
	w    io.Writer
	what string
}

func (p *lineProgress) layer(digest string, size int64) layerProgress {
	return &lineLayer{p: p, digest: digest, size: size}
}

func (p *lineProgress) wait() {}

type lineLayer struct {
	p      *lineProgress
	digest string
	size   int64
}

func (l *lineLayer) wrap(r io.Reader) io.Reader { return r }

func (l *lineLayer) done(fetched bool, err error) {
	l.p.mu.Lock()
	defer l.p.mu.Unlock()
	switch {
	case err != nil:
		fmt.Fprintf(l.p.w, "%s: layer %s: failed: %v\n", l.p.what, shortDigest(l.digest), err)
	case fetched:
		fmt.Fprintf(l.p.w, "%s: layer %s: pulled %s\n", l.p.what, shortDigest(l.digest), humanSize(l.size))
	default:
		fmt.Fprintf(l.p.w, "%s: layer %s: already here\n", l.p.what, shortDigest(l.digest))
	}
}

// barProgress draws a bar per layer.
type barProgress struct {
	p    *mpb.Progress
	what string
}

func (p *barProgress) layer(digest string, size int64) layerProgress {
	bar := p.p.AddBar(size,
		mpb.PrependDecorators(decor.Name(shortDigest(digest)+" ")),
		mpb.AppendDecorators(decor.OnComplete(decor.CountersKibiByte("% .1f / % .1f"), "done")),
	)
	return &barLayer{bar: bar}
}

func (p *barProgress) wait() { p.p.Wait() }

type barLayer struct{ bar *mpb.Bar }

func (l *barLayer) wrap(r io.Reader) io.Reader {
	pr, err := l.bar.ProxyReader(r)
	if err != nil {
		return r
	}
	return pr
}

func (l *barLayer) done(fetched bool, err error) {
	if err != nil || !fetched {
		l.bar.Abort(false)
		return
	}
	l.bar.SetTotal(-1, true)
}

type nopLayerProgress struct{}

func (nopLayerProgress) wrap(r io.Reader) io.Reader { return r }
func (nopLayerProgress) done(bool, error)           {}
