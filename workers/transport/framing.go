package transport

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"sync"
	"time"
)

// maxFrame bounds one message (a key/value block of a long sequence fits easily).
const maxFrame = 1 << 31

// heartbeatLen is the length word of a heartbeat, a frame without a body: above maxFrame, so
// no data frame has it.
const heartbeatLen = math.MaxUint64

// heartbeatsPerTimeout is how many heartbeats a live peer sends per PeerTimeout: one late
// heartbeat (a busy scheduler, a slow link) does not make it silent.
const heartbeatsPerTimeout = 4

// writeChunk is the most written under one write deadline: a large frame on a slow link that
// keeps moving is not a silent peer.
const writeChunk = 256 << 10

// recheck is how long a read whose deadline passed looks once more before blaming the peer.
const recheck = 20 * time.Millisecond

// conn is one connection to a peer: frames of a big-endian length and that many bytes, and
// heartbeats. Until watch, recv reads the socket itself (the rendezvous); from then on a
// reader goroutine drains it, so a peer's sends never wait on this rank's compute and only a
// silent peer stalls them.
type conn struct {
	c       net.Conn
	r       *bufio.Reader
	peer    int           // the rank at the other end, for errors
	timeout time.Duration // the peer's silence allowed (start); <= 0: unbounded
	wait    time.Duration // how long recv waits for a live peer's frame; <= 0: unbounded
	bounded bool          // reads wait at most timeout (set by watch)
	reading bool          // the reader goroutine owns r (set by watch)

	wmu  sync.Mutex // one writer at a time: a heartbeat never lands inside a frame
	werr error      // a failed write cut a frame short: every later send fails with it

	mu     sync.Mutex
	ready  *sync.Cond // frames or rerr changed
	frames [][]byte   // data read ahead, oldest first (the collectives' lockstep keeps it to a frame or two)
	rerr   error      // why the reader stopped

	stop     chan struct{} // closed to stop the heartbeats
	stopOnce sync.Once
	wg       sync.WaitGroup // the heartbeat sender and the reader
}

func newConn(nc net.Conn) *conn {
	c := &conn{c: nc, stop: make(chan struct{})}
	c.r = bufio.NewReaderSize(liveReader{c}, 1<<20)
	c.ready = sync.NewCond(&c.mu)
	return c
}

// liveReader reads c's socket; once c is bounded every read waits at most c.timeout, so any
// byte from the peer, heartbeat or data, proves it alive.
type liveReader struct{ c *conn }

func (l liveReader) Read(p []byte) (int, error) {
	c := l.c
	if !c.bounded {
		return c.c.Read(p)
	}
	_ = c.c.SetReadDeadline(time.Now().Add(c.timeout))
	n, err := c.c.Read(p)
	if n == 0 && errors.Is(err, os.ErrDeadlineExceeded) {
		// The deadline may have passed while this process itself did not run (stopped,
		// starved of CPU) with the peer's bytes already here: look once more.
		_ = c.c.SetReadDeadline(time.Now().Add(recheck))
		n, err = c.c.Read(p)
	}
	return n, err
}

// start names the peer at the other end and, with a timeout, sends it heartbeats until Close.
func (c *conn) start(peer int, timeout time.Duration) {
	c.peer, c.timeout = peer, timeout
	if timeout <= 0 {
		return
	}
	c.wg.Go(func() {
		tick := time.NewTicker(timeout / heartbeatsPerTimeout)
		defer tick.Stop()
		for {
			select {
			case <-c.stop:
				return
			case <-tick.C:
				if c.frame(heartbeatLen, nil) != nil {
					return
				}
			}
		}
	})
}

// watch hands the socket to a reader goroutine, which queues data frames for recv and, with a
// timeout, ends with ErrPeerSilent once the peer sends nothing for that long.
func (c *conn) watch() {
	if c.reading {
		return // a member watches rank 0 from the rendezvous on
	}
	c.bounded, c.reading = c.timeout > 0, true
	c.wg.Go(func() {
		for {
			b, err := c.readFrame()
			if err != nil && c.bounded && errors.Is(err, os.ErrDeadlineExceeded) {
				err = fmt.Errorf("%w: no heartbeat from rank %d for %v", ErrPeerSilent, c.peer, c.timeout)
			}
			c.mu.Lock()
			if err != nil {
				c.rerr = err
			} else {
				c.frames = append(c.frames, b)
			}
			c.ready.Broadcast()
			c.mu.Unlock()
			if err != nil {
				return
			}
		}
	})
}

// stopHeartbeats stops the heartbeat sender (Close; tests freeze a rank with it).
func (c *conn) stopHeartbeats() { c.stopOnce.Do(func() { close(c.stop) }) }

// Close closes the socket and waits for the connection's goroutines.
func (c *conn) Close() error {
	c.stopHeartbeats()
	err := c.c.Close()
	c.wg.Wait()
	return err
}

func (c *conn) send(b []byte) error {
	c.mu.Lock()
	silent := c.rerr
	c.mu.Unlock()
	if errors.Is(silent, ErrPeerSilent) {
		return silent // a peer that says nothing takes nothing either
	}
	return c.frame(uint64(len(b)), b)
}

// frame writes one frame: its length word (heartbeatLen for a heartbeat) and b.
func (c *conn) frame(n uint64, b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return c.werr
	}
	var hdr [8]byte
	binary.BigEndian.PutUint64(hdr[:], n)
	err := c.write(hdr[:])
	if err == nil {
		err = c.write(b)
	}
	if err != nil && c.timeout > 0 && errors.Is(err, os.ErrDeadlineExceeded) {
		err = fmt.Errorf("%w: rank %d took nothing sent to it for %v", ErrPeerSilent, c.peer, c.timeout)
	}
	c.werr = err
	return err
}

// write writes p; with a timeout, in chunks that must each leave within it.
func (c *conn) write(p []byte) error {
	for len(p) > 0 {
		n := len(p)
		if c.timeout > 0 {
			n = min(n, writeChunk)
			_ = c.c.SetWriteDeadline(time.Now().Add(c.timeout))
		}
		if _, err := c.c.Write(p[:n]); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// recv returns the next data frame: read here until watch, then from the reader goroutine.
func (c *conn) recv() ([]byte, error) {
	if !c.reading {
		return c.readFrame()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	late := false
	if c.wait > 0 && len(c.frames) == 0 && c.rerr == nil {
		timer := time.AfterFunc(c.wait, func() {
			c.mu.Lock()
			late = true
			c.ready.Broadcast()
			c.mu.Unlock()
		})
		defer timer.Stop()
	}
	for len(c.frames) == 0 && c.rerr == nil && !late {
		c.ready.Wait()
	}
	if len(c.frames) == 0 && c.rerr == nil {
		return nil, fmt.Errorf("%w: rank %d sent nothing for %v", ErrCollectiveTimeout, c.peer, c.wait)
	}
	if len(c.frames) == 0 {
		return nil, c.rerr
	}
	b := c.frames[0]
	c.frames[0] = nil
	c.frames = c.frames[1:]
	return b, nil
}

// readFrame reads the next data frame from the socket, passing over heartbeats.
func (c *conn) readFrame() ([]byte, error) {
	var hdr [8]byte
	for {
		if _, err := io.ReadFull(c.r, hdr[:]); err != nil {
			return nil, err
		}
		n := binary.BigEndian.Uint64(hdr[:])
		if n == heartbeatLen {
			continue
		}
		if n > maxFrame {
			return nil, fmt.Errorf("transport: frame of %d bytes is over the %d limit", n, maxFrame)
		}
		b := make([]byte, n)
		_, err := io.ReadFull(c.r, b)
		return b, err
	}
}
