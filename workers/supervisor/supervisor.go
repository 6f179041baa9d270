// Package supervisor is zaya-supervisor's logic: it runs a worker's command as the container's
// main process and applies the job's restart rule inside the pod, for clusters whose kubelet
// has no container restart rules (inPlaceMechanism Supervisor, docs/worker-contract.md).
//
// The kubelet still does every restart (the pod's restartPolicy is OnFailure): a restart it
// makes is one the operator sees, with the exit code and the termination message, through the
// pod's status, which needs no API token in the pod. A restart done inside the container would
// be invisible to it: it could neither count it nor tell when every rank is back. What the
// supervisor adds is the choice the restart rules would make: a worker exit the rule restarts
// ends the container with the same code, and any other one ends it with exit 0 and the code in
// the termination message, so the kubelet does not restart it and the operator fails the job.
//
// It also reports the progress of a trainer that cannot (progress.go): the trainer writes its
// step and checkpoint to the file ZAYA_PROGRESS_FILE names, and the supervisor serves them as
// the worker contract's progress document and appends them to the termination message.
package supervisor

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/zaya-operator/zaya-operator/api/contract"
	"github.com/zaya-operator/zaya-operator/workers/gangwatch"
)

// Config is one supervised run.
type Config struct {
	// Args is the worker's command.
	Args []string
	// Rule is the restart rule; nil passes every exit code through.
	Rule *contract.RestartRule
	// TerminationLog is the file the exit-code line is appended to ("": none).
	TerminationLog string
	// Log receives the supervisor's own messages.
	Log io.Writer
	// Gang, when set, watches the gang's other ranks (gangwatch): when one fails or is lost the
	// worker is stopped and the container exits 75, to be restarted in place with the others.
	Gang *gangwatch.Config
	// JoinWait bounds the wait for the gang's hub before the worker starts anyway.
	JoinWait time.Duration
	// OwnStop is how long a worker whose gang stopped over a peer's failure has to stop by
	// itself before it is sent SIGTERM: a worker that notices a lost peer (the reference
	// worker) exits 75 with its own words within it; one that does not (torchrun) is stopped.
	// A stop over a rank the gang watch lost (silent, gone) sends SIGTERM at once.
	OwnStop time.Duration
	// StopGrace is how long a stopped worker has between SIGTERM and SIGKILL.
	StopGrace time.Duration
	// ProgressListen is where the worker's progress file is served as contract.ProgressPath,
	// once it holds a report ("": nowhere). The termination message's progress lines do not
	// depend on it.
	ProgressListen string
	// ProgressPoll is how often the progress file is read (0: every second).
	ProgressPoll time.Duration
	// AnswerListen is where the supervisor answers the operator (contract.SupervisorPath)
	// while it runs ("": nowhere).
	AnswerListen string
	// NodeLostAt is when the operator found the rank this pod replaces lost with its node
	// (contract.EnvNodeLostAt; zero: not a replacement). The worker starts no earlier than a
	// quarter of the gang's timeout, CutGrace and a margin after it, by which time the old
	// rank's worker has been stopped by its own supervisor if its node was only cut off.
	NodeLostAt time.Time
	// CutGrace is how long a worker gets after SIGTERM, sent at once, when this rank lost the
	// hub itself: it may be the rank cut off, which the operator replaces elsewhere as soon
	// as its peers are back and it does not answer (docs/design/fast-node-loss.md); its worker
	// must be gone before the replacement's can start. 0: StopGrace.
	CutGrace time.Duration
}

// forwarded are the signals the worker gets as the container would have given them to it.
var forwarded = []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// Run runs the worker to its end and returns the container's exit code.
func Run(cfg Config) int {
	return cfg.decide(cfg.run())
}

// run starts the worker in a process group of its own, hands it every forwarded signal, and
// returns its exit code (128+n for death by signal n). A worker that cannot be started is a
// configuration error: exit 78.
func (cfg Config) run() int32 {
	if len(cfg.Args) == 0 {
		fmt.Fprintln(cfg.Log, "zaya-supervisor: no command to run")
		return contract.ExitConfig
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)
	defer serveAnswer(cfg.AnswerListen, cfg.Log)()

	var gang *gangwatch.Member
	var gangStop <-chan string
	if cfg.Gang != nil {
		m, err := gangwatch.Join(*cfg.Gang)
		if err != nil {
			fmt.Fprintf(cfg.Log, "zaya-supervisor: %v: running unwatched\n", err)
		} else {
			gang, gangStop = m, m.Stopped()
			// The worker starts in the gang: after a restart, not beside the last run's rank 0
			// while that still stops (its rendezvous store would take the new run in).
			select {
			case <-m.Joined():
			case <-time.After(cfg.JoinWait):
				fmt.Fprintf(cfg.Log, "zaya-supervisor: gang watch: no hub at %s within %s: starting the worker anyway\n", cfg.Gang.Hub, cfg.JoinWait)
			case s := <-sigs:
				fmt.Fprintf(cfg.Log, "zaya-supervisor: %v before the worker started\n", s)
				m.Leave(false, "")
				return contract.ExitStopped
			}
		}
	}
	if wait := cfg.oldRankStopped(time.Now()); wait > 0 {
		fmt.Fprintf(cfg.Log, "zaya-supervisor: this pod replaces a rank lost with its node: starting the worker in %s, once the old rank's is surely stopped\n",
			wait.Round(time.Millisecond))
		select {
		case <-time.After(wait):
		case s := <-sigs:
			fmt.Fprintf(cfg.Log, "zaya-supervisor: %v before the worker started\n", s)
			if gang != nil {
				gang.Leave(false, "")
			}
			return contract.ExitStopped
		}
	}
	cmd := exec.Command(cfg.Args[0], cfg.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	env, progress := cfg.startProgress(time.Now())
	if env != "" {
		cmd.Env = append(os.Environ(), env)
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(cfg.Log, "zaya-supervisor: cannot start the worker: %v\n", err)
		if progress != nil {
			progress.finish("")
		}
		if gang != nil {
			gang.Leave(false, "")
		}
		return contract.ExitConfig
	}
	pid := cmd.Process.Pid
	done := make(chan exited, 1)
	go func() { ws := reap(pid); done <- exited{ws, time.Now()} }()
	var stopped string      // why the gang stopped this rank
	var stoppedAt time.Time // when this rank's gang watch heard it
	signalled := false      // the supervisor sent the worker SIGTERM for the stop
	var term, kill <-chan time.Time
	var grace time.Duration // after SIGTERM, before SIGKILL
	for {
		select {
		case s := <-sigs:
			// The group: a launcher's children (torchrun's ranks) get the signal too.
			_ = syscall.Kill(-pid, s.(syscall.Signal))
		case why := <-gangStop:
			// A peer failed or was lost: this rank's worker may sit in a collective for as
			// long as its backend allows. Stop it now; the kubelet restarts the container.
			stopped, stoppedAt, gangStop = why, gang.StoppedAt(), nil
			own := cfg.OwnStop
			grace = cfg.StopGrace
			switch {
			case gang.LostHub() && cfg.CutGrace > 0:
				own, grace = 0, cfg.CutGrace
			case gang.PeerLost():
				own = 0 // the hub's words name the cause: a worker's own would only follow it
			}
			term = time.After(own)
		case <-term:
			fmt.Fprintf(cfg.Log, "zaya-supervisor: stopping the worker: %s\n", stopped)
			_ = syscall.Kill(-pid, syscall.SIGTERM)
			signalled = true
			kill = time.After(grace)
		case <-kill:
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		case x := <-done:
			// Nothing the worker started may outlive it into the next run: a stray rank would
			// hold its port, its GPU memory and its checkpoint files.
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			code := int32(x.status.ExitStatus())
			if x.status.Signaled() {
				code = 128 + int32(x.status.Signal())
			}
			if progress != nil {
				// What the worker reported, however it ended: a killed trainer wrote no lines itself.
				progress.finish(cfg.TerminationLog)
			}
			if stopped != "" && !stopCaused(code, x.at, stoppedAt, signalled) {
				fmt.Fprintf(cfg.Log, "zaya-supervisor: the worker exited %d on its own before the gang's stop (%s): its own exit stands\n", code, stopped)
				stopped = ""
			}
			if stopped != "" {
				if err := appendLine(cfg.TerminationLog, contract.TerminationMessageStoppedPrefix+" "+stopped); err != nil {
					fmt.Fprintf(cfg.Log, "zaya-supervisor: %v\n", err)
				}
				code = contract.ExitStopped
			}
			if gang != nil {
				// A fatal exit fails the job: the others need not restart for it.
				gang.Leave(code != 0 && (cfg.Rule == nil || cfg.Rule.Restarts(code)), fmt.Sprintf("exit %d", code))
			}
			return code
		}
	}
}

// maxLostWait bounds the wait for a lost rank's old worker: the instant comes from the pod's
// environment, and a clock far off must not keep a rank from ever starting.
const maxLostWait = 30 * time.Second

// oldRankStopped is how long, from now, this replacement's worker must still wait for the
// replaced rank's old worker to have stopped: the old rank's supervisor finds the hub gone
// within the gang's timeout of its last line from it, which came at most a quarter timeout
// before the hub found that rank silent (both beat every quarter timeout), and the operator
// decided after the hub's stop; it then kills its worker within CutGrace. A quarter second
// more for the two nodes' clocks.
func (cfg Config) oldRankStopped(now time.Time) time.Duration {
	if cfg.NodeLostAt.IsZero() || cfg.Gang == nil {
		return 0 // no hub watched, nothing stops the old worker on a cut: no bound to keep
	}
	wait := cfg.NodeLostAt.Add(cfg.Gang.Timeout/4 + cfg.CutGrace + 250*time.Millisecond).Sub(now)
	return min(max(wait, 0), maxLostWait)
}

// exited is how the worker ended and when the supervisor learned it.
type exited struct {
	status syscall.WaitStatus
	at     time.Time
}

// stopCaused reports whether a worker that exited with code at exitAt, in a gang stopped at
// stoppedAt, ended because of the stop: the supervisor signalled it, it stopped over a peer by
// itself (75), or it ended after the stop arrived. A worker that ended before the stop arrived
// ended on its own, whatever order the two reach the supervisor's loop in: its failure is
// what stopped the gang (the hub's stop follows it through its peers), and turning it into a
// stop over a peer would hide the job's root cause behind its own cascade.
func stopCaused(code int32, exitAt, stoppedAt time.Time, signalled bool) bool {
	return signalled || code == contract.ExitStopped || !exitAt.Before(stoppedAt)
}

// reap waits for any child until pid ends: as a container's PID 1 the supervisor inherits
// every orphan of the worker and must not leave them zombies.
func reap(pid int) syscall.WaitStatus {
	for {
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(-1, &ws, 0, nil)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case err != nil:
			// No child left to wait for: exec.Cmd reaped it first, which it never does here.
			return syscall.WaitStatus(contract.ExitConfig << 8)
		case got == pid:
			return ws
		}
	}
}

// decide turns the worker's exit into the container's: the kubelet restarts any non-zero
// exit, so one the rule does not restart ends the container with 0 and the code in the
// termination message.
func (cfg Config) decide(code int32) int {
	if cfg.Rule == nil || code == 0 || cfg.Rule.Restarts(code) {
		return int(code)
	}
	line := contract.TerminationMessageExitCodePrefix + strconv.FormatInt(int64(code), 10)
	if err := appendLine(cfg.TerminationLog, line); err != nil {
		// Without the line the operator would take the exit for success: let the kubelet
		// restart it instead, the lesser harm.
		fmt.Fprintf(cfg.Log, "zaya-supervisor: worker exited %d, which does not restart in place, but %v: exiting %d\n", code, err, code)
		return int(code)
	}
	fmt.Fprintf(cfg.Log, "zaya-supervisor: worker exited %d, which does not restart in place (%s): ending the container\n", code, cfg.Rule)
	return 0
}

func appendLine(path, line string) error {
	if path == "" {
		return errors.New("no termination log")
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(f, line)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
