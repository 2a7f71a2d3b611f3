// Package inflight serializes operations per volume without a global lock: kubelet
// and external-provisioner retry a CSI call that timed out while its pod still
// runs, and such a retry must not start a second pod for the same operation.
package inflight

import (
	"context"
	"sync"
)

// Set holds the keys whose operation is in progress.
type Set struct {
	mu   sync.Mutex
	keys map[string]chan struct{} // closed when a waitable operation ends; nil for the others
}

// TryAcquire marks key busy; it returns false (and a no-op release) when an
// operation on key is already in progress. The caller answers such a call with
// codes.Aborted, as the CSI spec asks, and the caller's caller retries.
func (s *Set) TryAcquire(key string) (release func(), ok bool) {
	return s.acquire(key, nil)
}

// TryAcquireWaitable is TryAcquire for an operation that another on the same
// key may wait for (Await) rather than be refused: one the caller started on
// its own ahead of the call that would have asked for it.
func (s *Set) TryAcquireWaitable(key string) (release func(), ok bool) {
	return s.acquire(key, make(chan struct{}))
}

func (s *Set) acquire(key string, done chan struct{}) (func(), bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys == nil {
		s.keys = map[string]chan struct{}{}
	}
	if _, busy := s.keys[key]; busy {
		return func() {}, false
	}
	s.keys[key] = done
	return func() {
		s.mu.Lock()
		delete(s.keys, key)
		s.mu.Unlock()
		// After the key is free: a waiter's TryAcquire then succeeds.
		if done != nil {
			close(done)
		}
	}, true
}

// Await waits until the operation on key ends, if it is a waitable one
// (TryAcquireWaitable), and says whether it waited; it returns false at once
// when key is free or held by an operation that is not waitable, and ctx's
// error when ctx ends first.
func (s *Set) Await(ctx context.Context, key string) (bool, error) {
	s.mu.Lock()
	done := s.keys[key]
	s.mu.Unlock()
	if done == nil {
		return false, nil
	}
	select {
	case <-done:
		return true, nil
	case <-ctx.Done():
		return true, ctx.Err()
	}
}
