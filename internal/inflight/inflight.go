// Package inflight serializes operations per volume without a global lock: kubelet
// and external-provisioner retry a CSI call that timed out while its pod still
// runs, and such a retry must not start a second pod for the same operation.
package inflight

import "sync"

// Set holds the keys whose operation is in progress.
type Set struct {
	mu   sync.Mutex
	keys map[string]struct{}
}

// TryAcquire marks key busy; it returns false (and a no-op release) when an
// operation on key is already in progress. The caller answers such a call with
// codes.Aborted, as the CSI spec asks, and the caller's caller retries.
func (s *Set) TryAcquire(key string) (release func(), ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys == nil {
		s.keys = map[string]struct{}{}
	}
	if _, busy := s.keys[key]; busy {
		return func() {}, false
	}
	s.keys[key] = struct{}{}
	return func() {
		s.mu.Lock()
		delete(s.keys, key)
		s.mu.Unlock()
	}, true
}
