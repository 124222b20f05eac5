package cacheline

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"
)

func TestSpanCoversEveryLineFromInside(t *testing.T) {
	buf := make([]byte, 1024)
	base := unsafe.Pointer(unsafe.SliceData(buf))
	// Align the start so that the cases below know where lines begin.
	align := int((Size - uintptr(base)%Size) % Size)
	for _, tc := range []struct {
		start, n int
		want     int // lines
	}{
		{0, 1, 1},
		{0, 64, 1},
		{0, 65, 2},
		{10, 54, 1},  // ends at the line's last byte
		{10, 55, 2},  // one byte into the next
		{63, 2, 2},   // straddles a boundary
		{1, 190, 3},  // 1..190: lines 0, 1, 2
		{0, 512, 8},  //
		{32, 512, 9}, // unaligned: one more
	} {
		p := unsafe.Add(base, align+tc.start)
		got := Span(nil, p, uintptr(tc.n))
		if len(got) != tc.want {
			t.Errorf("Span(+%d, %d): %d lines, want %d", tc.start, tc.n, len(got), tc.want)
			continue
		}
		if got[0] != p {
			t.Errorf("Span(+%d, %d): first %p, want %p", tc.start, tc.n, got[0], p)
		}
		seen := map[uintptr]bool{}
		for _, q := range got {
			off := uintptr(q) - uintptr(p)
			if off >= uintptr(tc.n) {
				t.Errorf("Span(+%d, %d): %p is %d bytes past the start, outside", tc.start, tc.n, q, off)
			}
			line := uintptr(q) / Size
			if seen[line] {
				t.Errorf("Span(+%d, %d): line %#x twice", tc.start, tc.n, line)
			}
			seen[line] = true
		}
		// Every byte's line is named.
		for i := range tc.n {
			if !seen[(uintptr(p)+uintptr(i))/Size] {
				t.Errorf("Span(+%d, %d): the line of byte %d is missing", tc.start, tc.n, i)
				break
			}
		}
	}
	if got := Span(nil, base, 0); len(got) != 0 {
		t.Errorf("Span of 0 bytes: %d lines", len(got))
	}
	if got := Span(nil, nil, 8); len(got) != 0 {
		t.Errorf("Span of nil: %d lines", len(got))
	}
}

func TestOfAndString(t *testing.T) {
	type big struct{ a [200]byte }
	v := new(big)
	got := Of(nil, v)
	if n := len(got); n < 4 || n > 5 { // 200 bytes span 4 lines, 5 unaligned
		t.Errorf("Of(200 bytes): %d lines", n)
	}
	if got[0] != unsafe.Pointer(v) {
		t.Errorf("Of: first %p, want the object %p", got[0], v)
	}
	if got := Of[big](nil, nil); len(got) != 0 {
		t.Errorf("Of(nil): %d lines", len(got))
	}
	s := string(make([]byte, 100))
	if got := String(nil, s); len(got) < 2 || got[0] != unsafe.Pointer(unsafe.StringData(s)) {
		t.Errorf("String(100 bytes): %v", got)
	}
	if got := String([]unsafe.Pointer{nil}, ""); len(got) != 1 {
		t.Errorf("String(\"\") appended %d", len(got)-1)
	}
}

func TestLoadSumsUpToTheFirstNil(t *testing.T) {
	a, b, c := []byte{3}, []byte{4}, []byte{100}
	lines := []unsafe.Pointer{unsafe.Pointer(&a[0]), unsafe.Pointer(&b[0]), nil, unsafe.Pointer(&c[0])}
	if got := Load(lines); got != 7 {
		t.Errorf("Load = %d, want 7 (3+4, stopping at the nil)", got)
	}
	if got := Load(nil); got != 0 {
		t.Errorf("Load(nil) = %d", got)
	}
}

// TestLoadWhileWritten loads lines another goroutine writes: under -race
// this fails unless Load is kept out of the detector (go:norace), as it
// must be (the loop loads lines that their owners may be writing).
func TestLoadWhileWritten(t *testing.T) {
	type obj struct{ b [128]byte }
	o := new(obj)
	lines := Of(nil, o)
	var wg sync.WaitGroup
	var stop atomic.Bool
	wg.Go(func() {
		for i := 0; !stop.Load(); i++ {
			o.b[0] = byte(i)
			runtime.Gosched()
		}
	})
	var sum byte
	for range 1000 {
		sum += Load(lines)
		runtime.Gosched()
	}
	stop.Store(true)
	wg.Wait()
	_ = sum
}
