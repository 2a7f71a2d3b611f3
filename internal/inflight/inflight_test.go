package inflight

import (
	"sync"
	"sync/atomic"
	"testing"
)

func TestTryAcquire(t *testing.T) {
	var s Set
	release, ok := s.TryAcquire("a")
	if !ok {
		t.Fatal("first acquire of a failed")
	}
	if _, ok := s.TryAcquire("a"); ok {
		t.Fatal("second acquire of a succeeded while busy")
	}
	relB, ok := s.TryAcquire("b")
	if !ok {
		t.Fatal("other keys must not be blocked")
	}
	relB()
	release()
	release2, ok := s.TryAcquire("a")
	if !ok {
		t.Fatal("acquire after release failed")
	}
	release2()
}

func TestConcurrentSingleWinner(t *testing.T) {
	var s Set
	var winners atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if _, ok := s.TryAcquire("vol"); ok {
				winners.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	if n := winners.Load(); n != 1 {
		t.Fatalf("%d goroutines acquired the same key, want 1", n)
	}
}
