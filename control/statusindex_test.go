package control_test

import (
	"testing"
	"time"

	"github.com/hearthd/hearth/control"
)

// TestDryRunReadsNoStoredStatus: a node report is first decided in a dry
// run, without the change lock, from reads that may lag; moving the
// server's status index entry there read the stored record again from the
// store (on PostgreSQL a round trip per report), for a batch the dry run
// throws away.
func TestDryRunReadsNoStoredStatus(t *testing.T) {
	// No sweep beside the test: the count swaps the server's store.
	e := newEnv(t, func(c *control.Config) { c.SweepInterval = time.Hour })
	e.enroll(hwM4)
	id := idOf(t, e.req("POST", "/v1/servers", serverBody("dry")).must(t, 201))
	reads, err := control.DryRunStatusReads(e.srv, id, "running")
	if err != nil {
		t.Fatal(err)
	}
	if reads != 0 {
		t.Fatalf("staging a status change in a dry run read the store %d times, want none", reads)
	}
}
