package inflight

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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

// TestAwait: only a waitable operation is waited for, until it ends, after
// which the key can be had; a free key, or one a plain operation holds, is
// not waited for at all.
func TestAwait(t *testing.T) {
	for _, tc := range []struct {
		name     string
		hold     func(s *Set, key string) (release func(), ok bool) // nil: the key is free
		ctxDone  bool                                               // the waiter gives up first
		waited   bool
		err      bool
		acquires bool // TryAcquire succeeds once Await returned
	}{
		{"free key", nil, false, false, false, true},
		{"plain operation", (*Set).TryAcquire, false, false, false, false},
		{"waitable operation", (*Set).TryAcquireWaitable, false, true, false, true},
		{"waitable operation, waiter gives up", (*Set).TryAcquireWaitable, true, true, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s Set
			if tc.hold != nil {
				release, ok := tc.hold(&s, "vol")
				if !ok {
					t.Fatal("could not hold the key")
				}
				if !tc.ctxDone {
					time.AfterFunc(50*time.Millisecond, release)
				} else {
					defer release()
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			if tc.ctxDone {
				time.AfterFunc(50*time.Millisecond, cancel)
			}
			defer cancel()
			waited, err := s.Await(ctx, "vol")
			if waited != tc.waited || (err != nil) != tc.err {
				t.Fatalf("Await = %v, %v; want waited %v, error %v", waited, err, tc.waited, tc.err)
			}
			release, ok := s.TryAcquire("vol")
			if ok != tc.acquires {
				t.Fatalf("TryAcquire after Await: %v, want %v", ok, tc.acquires)
			}
			if ok {
				release()
			}
		})
	}
}
