// Package gangwatch lets the supervisors of one gang's ranks stop together when one rank
// fails, for trainers that do not: a PyTorch rank whose peer died sits in its collective until
// the backend times out, and torchrun's agent then waits up to 300 s in its exit barrier, so
// the kubelet never gets to restart it in place. Rank 0's supervisor runs a hub at
// MASTER_ADDR; every rank's supervisor (rank 0's too) holds a connection to it and both sides
// send a beat every quarter of the timeout. A member whose worker failed, whose connection
// closed without its worker being done, or that fell silent (a frozen node) makes the hub tell
// every other member to stop, and a member that loses the hub stops by itself. A stopped
// member ends its worker and exits 75, which the kubelet restarts in place: one failure costs
// a few seconds, no API token in any pod and no write by the operator.
package gangwatch

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Config is one rank's membership.
type Config struct {
	// Rank is this pod's node rank (NODE_RANK); rank 0 runs the hub.
	Rank int
	// GPUsPerNode turns node ranks into the global ranks of a stop's message (the operator
	// reads "lost rank N …: peer silent" with N global).
	GPUsPerNode int
	// Hub is the hub's address (MASTER_ADDR and the gang port).
	Hub string
	// Listen is where rank 0's hub listens (":<gang port>", or the pod's own address where
	// pods share a host).
	Listen string
	// Token names the gang (the job's UID and attempt): a connection that does not present
	// it is another job's, or an older attempt's, and is dropped.
	Token string
	// Timeout is how long a member or the hub may stay silent before it is lost.
	Timeout time.Duration
	// Log receives what the watch sees.
	Log io.Writer
}

// Member is one rank's place in the gang.
type Member struct {
	cfg      Config
	joined   chan struct{} // closed once the hub has this member
	stop     chan string   // the reason the gang stops, once
	once     sync.Once
	cancel   context.CancelFunc
	mu       sync.Mutex
	conn     net.Conn // to the hub, once connected
	hub      *hub
	stopped  bool
	lostHub  bool      // the stop is this member's own loss of the hub, not the hub's word
	overLost bool      // the stop is over a peer lost (silent or gone), not a failure's word
	stopAt   time.Time // when the stop was heard, set before it is sent
}

// Join starts rank 0's hub (on every other rank: nothing) and connects to the hub in the
// background. It fails only when rank 0's hub cannot listen.
func Join(cfg Config) (*Member, error) {
	ctx, cancel := context.WithCancel(context.Background())
	m := &Member{cfg: cfg, joined: make(chan struct{}), stop: make(chan string, 1), cancel: cancel}
	if cfg.Rank == 0 {
		h, err := listen(cfg)
		if err != nil {
			cancel()
			return nil, err
		}
		m.hub = h
		go h.serve()
	}
	go m.connect(ctx)
	return m, nil
}

// Joined is closed once this member is in the hub: a worker started after it meets a gang
// whose rank 0 is new too. One started before may meet the last run's rank 0, still stopping
// (its rendezvous store still up), and fail again when that goes.
func (m *Member) Joined() <-chan struct{} { return m.joined }

// Stopped yields why the gang stops, when it does.
func (m *Member) Stopped() <-chan string { return m.stop }

// StoppedAt is when this member heard the stop Stopped yields (zero before it): a worker that
// had ended before then ended on its own, whenever its supervisor gets to either.
func (m *Member) StoppedAt() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stopAt
}

// Leave tells the hub how this rank's worker ended (failed: the gang stops; done: it leaves
// quietly) and closes the membership.
func (m *Member) Leave(failed bool, why string) {
	m.mu.Lock()
	m.stopped = true
	if m.conn != nil {
		word := "done"
		if failed {
			word = "down " + oneLine(why)
		}
		_ = m.conn.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = fmt.Fprintf(m.conn, "%s\n", word)
		_ = m.conn.Close()
	}
	m.mu.Unlock()
	m.cancel()
	if m.hub != nil {
		if failed {
			// Rank 0's own line may not have reached its hub yet: stop the gang here, or
			// close would drop the members first and they would hear only EOF.
			m.hub.stopAll(m.cfg.Rank, fmt.Sprintf("node rank %d's worker failed: %s", m.cfg.Rank, oneLine(why)))
		} else {
			m.hub.end() // the run is complete: the others finish theirs unwatched
		}
		m.hub.waitStopped(time.Second) // rank 0: the others hear of its worker's end first
		m.hub.close()
	}
}

// fire fires the stop; lost says this member lost the hub.
func (m *Member) fire(why string, lost bool) {
	m.once.Do(func() {
		m.mu.Lock()
		m.stopAt, m.lostHub, m.overLost = time.Now(), lost, lost || lostWords.MatchString(why)
		m.mu.Unlock()
		m.stop <- why
	})
}

// LostHub reports whether the gang stopped because this member lost the hub (silent or
// gone), or, on rank 0, because its hub lost a member, rather than by a failure's word: this
// rank may be the one cut off, and its rank replaced elsewhere while it still runs.
func (m *Member) LostHub() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lostHub
}

// PeerLost reports whether the gang stopped over a rank lost (silent or gone, as the hub or
// this member found it) rather than by a failure's word: the lost rank's peers have nothing
// of their own to add, and their workers may sit in a collective with it until stopped.
func (m *Member) PeerLost() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.overLost
}

// lostWords are the hub's stop words for a member it lost (hub.serve's stopLost), as a
// member hears them after "gang watch: ".
var lostWords = regexp.MustCompile(`^gang watch: (lost rank \d+ \(node rank \d+\): peer silent|node rank \d+'s supervisor went away)`)

// connect dials the hub until it answers (it may not run yet: rank 0 starts with the others),
// then follows it: its stop, its beats, its loss.
func (m *Member) connect(ctx context.Context) {
	var c net.Conn
	var r *bufio.Reader
	var first string
	for c == nil {
		conn, reader, word, err := m.greet(ctx)
		if ctx.Err() != nil {
			if conn != nil {
				_ = conn.Close()
			}
			return
		}
		if err == nil {
			c, r, first = conn, reader, word
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
	m.mu.Lock()
	if m.stopped {
		m.mu.Unlock()
		_ = c.Close()
		return
	}
	m.conn = c
	m.mu.Unlock()
	close(m.joined)
	go beat(ctx, c, m.cfg.Timeout, &m.mu)
	if first == "end" {
		return // rank 0 was done as this member came in
	}
	for {
		_ = c.SetReadDeadline(time.Now().Add(m.cfg.Timeout))
		line, err := readLine(r)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				m.fire(fmt.Sprintf("gang watch: lost rank 0 (node rank 0, the hub at %s): peer silent for %s", m.cfg.Hub, m.cfg.Timeout), true)
			} else {
				m.fire(fmt.Sprintf("gang watch: lost the hub (node rank 0 at %s): %v", m.cfg.Hub, err), true)
			}
			return
		}
		word := strings.TrimSpace(line)
		if why, ok := strings.CutPrefix(word, "stop "); ok {
			m.fire("gang watch: "+why, m.hub != nil && m.hub.lost())
			return
		}
		if word == "end" {
			return // rank 0 is done: nothing left to watch
		}
	}
}

// greet dials the hub, says hello and waits for the hub's first word: only a hub that answers
// has this member. A connection is not enough: a frozen rank 0 (SIGSTOP, a frozen node) still
// completes handshakes in its kernel, and a member that took that for joining would start its
// worker against a rank 0 that never trains, stop over it a timeout later, and go round again
// until the hub's rank is replaced. A hub that stops as it takes the member in ("stop") is
// the last run's: the member waits for the next one.
func (m *Member) greet(ctx context.Context) (net.Conn, *bufio.Reader, string, error) {
	d := net.Dialer{Timeout: m.cfg.Timeout}
	c, err := d.DialContext(ctx, "tcp", m.cfg.Hub)
	if err != nil {
		return nil, nil, "", err
	}
	_ = c.SetWriteDeadline(time.Now().Add(m.cfg.Timeout))
	if _, err := fmt.Fprintf(c, "hello %s %d\n", m.cfg.Token, m.cfg.Rank); err != nil {
		_ = c.Close()
		return nil, nil, "", err
	}
	// The hub welcomes a member at once; a hub of an older supervisor beats within a quarter
	// of the timeout.
	_ = c.SetReadDeadline(time.Now().Add(m.cfg.Timeout))
	r := bufio.NewReaderSize(c, maxLine)
	line, err := readLine(r)
	word := strings.TrimSpace(line)
	if err == nil && strings.HasPrefix(word, "stop ") {
		err = errors.New("the hub is stopping")
	}
	if err != nil {
		_ = c.Close()
		return nil, nil, "", err
	}
	return c, r, word, nil
}

// beat writes a beat every quarter of timeout until ctx ends; mu guards the connection's writes.
func beat(ctx context.Context, c net.Conn, timeout time.Duration, mu *sync.Mutex) {
	t := time.NewTicker(timeout / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			mu.Lock()
			_ = c.SetWriteDeadline(time.Now().Add(timeout))
			_, err := io.WriteString(c, "beat\n")
			mu.Unlock()
			if err != nil {
				return // the reader sees the loss
			}
		}
	}
}

// hub is rank 0's: it knows the members and stops them all at the first failure.
type hub struct {
	cfg      Config
	ln       net.Listener
	mu       sync.Mutex
	members  map[int]*member
	stopped  bool
	lostPeer bool // the stop was over a member lost, not a word
	stopDone chan struct{}
}

type member struct {
	conn net.Conn
	mu   sync.Mutex // its writes
}

func listen(cfg Config) (*hub, error) {
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("gang watch: the hub cannot listen at %s: %w", cfg.Listen, err)
	}
	return &hub{cfg: cfg, ln: ln, members: map[int]*member{}, stopDone: make(chan struct{})}, nil
}

func (h *hub) serve() {
	for {
		c, err := h.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// Out of file descriptors (a burst of connections from anywhere: the port is open to
			// every pod), or another passing error: a hub that stopped accepting would keep every
			// restarted rank out of the gang for good.
			time.Sleep(acceptRetry)
			continue
		}
		go h.admit(c)
	}
}

// acceptRetry is how long the hub waits after a failed accept.
const acceptRetry = 50 * time.Millisecond

// maxLine bounds a line either side reads: the longest the protocol writes is a stop with its
// reason (oneLine's 300 bytes). A peer that sends more without a newline is not a supervisor,
// and reading on would grow the reader by whatever it sends.
const maxLine = 1024

// errLongLine is a line over maxLine.
var errLongLine = errors.New("gang watch: a line over 1024 bytes")

// readLine reads one line of at most maxLine bytes from r, a reader of that size.
func readLine(r *bufio.Reader) (string, error) {
	b, err := r.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		return "", errLongLine
	}
	return string(b), err
}

// admit reads a connection's hello and follows the member until it leaves or is lost.
func (h *hub) admit(c net.Conn) {
	r := bufio.NewReaderSize(c, maxLine)
	_ = c.SetReadDeadline(time.Now().Add(h.cfg.Timeout))
	line, err := readLine(r)
	f := strings.Fields(line)
	rank := -1
	if len(f) == 3 && f[0] == "hello" && f[1] == h.cfg.Token {
		if n, perr := strconv.Atoi(f[2]); perr == nil && n >= 0 {
			rank = n
		}
	}
	if err != nil || rank < 0 {
		_ = c.Close() // a stray client, another job's or an older attempt's rank
		return
	}
	m := &member{conn: c}
	h.mu.Lock()
	if h.stopped {
		h.mu.Unlock()
		_ = c.Close()
		return
	}
	if old := h.members[rank]; old != nil {
		_ = old.conn.Close() // the rank's new run replaces its old one
	}
	h.members[rank] = m
	h.mu.Unlock()
	// The member starts its worker on this word: a hub that cannot say it has not taken it in.
	m.mu.Lock()
	_ = c.SetWriteDeadline(time.Now().Add(h.cfg.Timeout))
	_, werr := io.WriteString(c, "welcome\n")
	m.mu.Unlock()
	if werr != nil {
		h.leave(rank, m)
		return
	}
	fmt.Fprintf(h.cfg.Log, "zaya-supervisor: gang watch: node rank %d joined\n", rank)
	go func() {
		t := time.NewTicker(h.cfg.Timeout / 4)
		defer t.Stop()
		for range t.C {
			m.mu.Lock()
			_ = c.SetWriteDeadline(time.Now().Add(h.cfg.Timeout))
			_, err := io.WriteString(c, "beat\n")
			m.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	for {
		_ = c.SetReadDeadline(time.Now().Add(h.cfg.Timeout))
		line, err := readLine(r)
		word := strings.TrimSpace(line)
		switch {
		case err == nil && word == "beat":
			continue
		case err == nil && word == "done":
			h.leave(rank, m)
			return
		case err == nil && strings.HasPrefix(word, "down"):
			h.stopAll(rank, fmt.Sprintf("node rank %d's worker failed: %s", rank, strings.TrimSpace(strings.TrimPrefix(word, "down"))))
			return
		case err == nil:
			continue // a word of a newer supervisor
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			g := rank * max(h.cfg.GPUsPerNode, 1)
			h.stopLost(rank, fmt.Sprintf("lost rank %d (node rank %d): peer silent for %s", g, rank, h.cfg.Timeout))
		} else {
			h.stopLost(rank, fmt.Sprintf("node rank %d's supervisor went away: %v", rank, err))
		}
		return
	}
}

func (h *hub) leave(rank int, m *member) {
	h.mu.Lock()
	if h.members[rank] == m {
		delete(h.members, rank)
	}
	h.mu.Unlock()
	_ = m.conn.Close()
}

// stopAll tells every member but from to stop, once, and takes no one in any more: the gang
// meets again at the next hub, rank 0's next run.
func (h *hub) stopAll(from int, why string) { h.stop(from, why, false) }

// stopLost stops the gang over a member the hub lost (silent or gone): rank 0 may be the one
// cut off, so its own member stops at once (lost).
func (h *hub) stopLost(from int, why string) { h.stop(from, why, true) }

func (h *hub) stop(from int, why string, lost bool) {
	if h.finish(from, "stop "+oneLine(why), lost) {
		fmt.Fprintf(h.cfg.Log, "zaya-supervisor: gang watch: stopping the gang: %s\n", why)
	}
}

// lost reports whether the hub stopped the gang over a member it lost (silent or gone).
func (h *hub) lost() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lostPeer
}

// end tells every member that rank 0's run is complete, and takes no one in any more.
func (h *hub) end() { h.finish(-1, "end", false) }

// finish, the first time only, closes the hub to newcomers and sends line to every member but
// except, recording whether it is over a member lost; it reports whether it did.
func (h *hub) finish(except int, line string, lost bool) bool {
	h.mu.Lock()
	if h.stopped {
		h.mu.Unlock()
		return false
	}
	h.stopped, h.lostPeer = true, lost
	_ = h.ln.Close()
	others := make([]*member, 0, len(h.members))
	for r, m := range h.members {
		if r != except {
			others = append(others, m)
		}
	}
	h.mu.Unlock()
	var wg sync.WaitGroup
	for _, m := range others {
		wg.Go(func() {
			m.mu.Lock()
			_ = m.conn.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = io.WriteString(m.conn, line+"\n")
			m.mu.Unlock()
		})
	}
	wg.Wait()
	close(h.stopDone)
	return true
}

// waitStopped waits up to d for a stop under way to reach the members.
func (h *hub) waitStopped(d time.Duration) {
	h.mu.Lock()
	stopped := h.stopped
	h.mu.Unlock()
	if !stopped {
		return
	}
	select {
	case <-h.stopDone:
	case <-time.After(d):
	}
}

func (h *hub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	_ = h.ln.Close()
	for _, m := range h.members {
		_ = m.conn.Close()
	}
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 300 {
		s = s[:300]
	}
	return s
}
