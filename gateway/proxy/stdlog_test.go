package proxy

import (
	"log"
	"log/slog"
	"testing"
	"time"
)

// TestStdLogSkipsSlogDefault: slog's default handler writes through the standard logger, so taking
// it as the target would loop back into the logger's own lock; a proxy built with it must leave the
// standard logger's lines where they went.
func TestStdLogSkipsSlogDefault(t *testing.T) {
	before := stdLogTarget.Load()
	t.Cleanup(func() { stdLogTarget.Store(before) })
	captureStdLog(slog.Default())
	done := make(chan struct{})
	go func() {
		log.Print("kvexact stdlog test line")
		slog.Info("kvexact stdlog test record")
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the standard logger deadlocked on slog's default handler")
	}
}
