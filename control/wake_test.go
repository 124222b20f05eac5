package control

import "testing"

// A node that a commit of this process in flight will wake is not woken by
// the notification of a commit (its own or another replica's): it is
// woken once this process's commit is done, when its read cache has the
// records; with no commit of its own in flight, a notification wakes it.
func TestOwnCommitWakesItsNodes(t *testing.T) {
	s := &Server{watch: map[string]chan struct{}{}, ownWake: map[string]int{}, nodeCredit: map[string]int{}}
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	s.ownWake["n1"] = 2 // two commits in flight
	ch := s.watcher("n1")
	s.remoteWake(wakePrefix + "n1")
	if closed(ch) {
		t.Fatal("the notification woke a node a commit in flight will wake")
	}
	s.wakeOwn("n1")
	if !closed(ch) {
		t.Fatal("the commit done did not wake its node")
	}
	ch = s.watcher("n1")
	s.remoteWake(wakePrefix + "n1")
	if closed(ch) {
		t.Fatal("the notification woke a node the second commit in flight will wake")
	}
	s.wakeOwn("n1")
	if !closed(ch) || len(s.ownWake) != 0 {
		t.Fatalf("second commit: woken %v, in flight %v", closed(ch), s.ownWake)
	}
	ch = s.watcher("n1")
	s.remoteWake(wakePrefix + "n1")
	if !closed(ch) {
		t.Fatal("with no commit of its own in flight, the notification did not wake the node")
	}
	other := s.watcher("n2")
	s.ownWake["n1"] = 1
	s.remoteWake(wakePrefix + "n2")
	if !closed(other) {
		t.Fatal("another node's notification was held back")
	}
}
