package inventory

// fifoChunk keys per chunk: 8 KiB, so an endpoint's queue wastes at most two chunks and grows
// without ever copying its contents (a doubling ring would cost up to 2× at the wrong moment).
const fifoChunk = 1024

// fifo is one endpoint's queue of keys in the order they became resident. It serves FIFO
// retirement and O(n) clear. Entries may be dead (the key was removed since); the table's pending
// count per (endpoint, key) tells live from dead, and the endpoint compacts the queue when dead
// entries pile up.
type fifo struct {
	chunks []*[fifoChunk]uint64
	head   int // next entry to pop in chunks[0]
	tail   int // next free entry in the last chunk
	n      int
}

func (f *fifo) push(k uint64) {
	if len(f.chunks) == 0 || f.tail == fifoChunk {
		f.chunks = append(f.chunks, new([fifoChunk]uint64))
		f.tail = 0
	}
	f.chunks[len(f.chunks)-1][f.tail] = k
	f.tail++
	f.n++
}

func (f *fifo) peek() (uint64, bool) {
	if f.n == 0 {
		return 0, false
	}
	return f.chunks[0][f.head], true
}

func (f *fifo) pop() (uint64, bool) {
	if f.n == 0 {
		return 0, false
	}
	k := f.chunks[0][f.head]
	f.head++
	f.n--
	if f.n == 0 {
		*f = fifo{}
	} else if f.head == fifoChunk {
		f.chunks[0] = nil
		f.chunks = f.chunks[1:]
		f.head = 0
	}
	return k, true
}

// each calls fn for every entry, oldest first.
func (f *fifo) each(fn func(k uint64)) {
	left := f.n
	for ci, c := range f.chunks {
		start := 0
		if ci == 0 {
			start = f.head
		}
		for i := start; i < fifoChunk && left > 0; i++ {
			fn(c[i])
			left--
		}
	}
}
