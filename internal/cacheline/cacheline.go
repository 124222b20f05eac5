// Package cacheline names the cache lines of objects and loads them
// together.
//
// A handler that follows pointers from one cold object to the next waits
// for memory once per object, one after another. Loading a byte of each of
// its objects first, with no load depending on another, lets the processor
// fetch them all at once: one wait instead of one per object. The event
// loop does this before it runs a stream's handler (evloop.Loop.SetHot):
// at c=1 000 a stream's objects have left the caches by its next token, and
// its handler met some 15 of them one at a time (BENCHMARKS.md, issue 15).
package cacheline

import "unsafe"

// Size is the unit a processor loads from memory (64 bytes on amd64 and
// arm64; a larger one only means some lines are loaded twice).
const Size = 64

// Of appends the addresses of the cache lines *p spans to dst; nothing for
// a nil p.
func Of[T any](dst []unsafe.Pointer, p *T) []unsafe.Pointer {
	if p == nil {
		return dst
	}
	return Span(dst, unsafe.Pointer(p), unsafe.Sizeof(*p))
}

// String appends the lines of s's bytes.
func String(dst []unsafe.Pointer, s string) []unsafe.Pointer {
	if s == "" {
		return dst
	}
	return Span(dst, unsafe.Pointer(unsafe.StringData(s)), uintptr(len(s)))
}

// Span appends the lines of the n bytes at p. Every address is inside
// them (an address past an object would keep whatever follows it alive, or
// point nowhere): the first is p, the others start lines within the span.
func Span(dst []unsafe.Pointer, p unsafe.Pointer, n uintptr) []unsafe.Pointer {
	if p == nil || n == 0 {
		return dst
	}
	dst = append(dst, p)
	next := Size - uintptr(p)%Size // the next line's start, from p
	for off := next; off < n; off += Size {
		dst = append(dst, unsafe.Add(p, off))
	}
	return dst
}

// Load loads a byte at each address up to the first nil, independently of
// each other, and returns their sum, which a caller keeps (a sum no one
// reads would let the compiler drop the loads).
//
// The bytes may be written by other goroutines meanwhile: the value is
// never used for anything, and a byte load is whole on every processor Go
// runs on. So the race detector is told to ignore it.
//
//go:norace
func Load(lines []unsafe.Pointer) (sum byte) {
	for _, p := range lines {
		if p == nil {
			break
		}
		sum += *(*byte)(p)
	}
	return sum
}
