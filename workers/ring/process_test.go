package ring

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/zaya-operator/zaya-operator/internal/testnet"
	"github.com/zaya-operator/zaya-operator/workers/attention"
	"github.com/zaya-operator/zaya-operator/workers/transport"
)

// TestMain doubles as a ring rank when ZAYA_RING_CHILD is set: the test below starts one real
// process per rank, talking TCP, as ranks in separate pods would.
func TestMain(m *testing.M) {
	if os.Getenv("ZAYA_RING_CHILD") != "" {
		if err := childRank(); err != nil {
			fmt.Fprintln(os.Stderr, "rank:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type childResult struct {
	LSE []float64
	Out []float32
}

// problem is the same random q, k and v in every process.
func problem(seq, d int) (q, k, v attention.Matrix) {
	r := rand.New(rand.NewPCG(uint64(seq), uint64(d)))
	return randomMatrix(r, seq, d), randomMatrix(r, seq, d), randomMatrix(r, seq, d)
}

func childRank() error {
	atoi := func(k string) int { n, _ := strconv.Atoi(os.Getenv(k)); return n }
	rank, world, seq, d := atoi("RANK"), atoi("WORLD_SIZE"), atoi("ZAYA_SEQ"), atoi("ZAYA_DIM")
	causal := os.Getenv("ZAYA_CAUSAL") == "1"
	tr, err := transport.Dial(context.Background(), transport.Config{
		Rank: rank, World: world, Listen: "127.0.0.1:0",
		Master: net.JoinHostPort(os.Getenv("MASTER_ADDR"), os.Getenv("MASTER_PORT")),
	})
	if err != nil {
		return err
	}
	defer func() { _ = tr.Close() }()
	l := Layout{Seq: seq, Ranks: world}
	q, k, v := problem(seq, d)
	pos := l.Positions(rank)
	p, err := Forward(attention.CPU, l, rank, q.SelectRows(pos), k.SelectRows(pos), v.SelectRows(pos), causal, 1/math.Sqrt(float64(d)), Over(tr))
	if err != nil {
		return err
	}
	if err := tr.Barrier(); err != nil {
		return err
	}
	b, err := json.Marshal(childResult{LSE: p.LSE, Out: p.Out.Data})
	if err != nil {
		return err
	}
	return os.WriteFile(os.Getenv("ZAYA_OUT"), b, 0o600)
}

// TestRingAcrossProcessesOverTCP runs P real processes that rendezvous through
// MASTER_ADDR:MASTER_PORT and pass key/value blocks over TCP, and checks every rank's slice
// against full attention.
func TestRingAcrossProcessesOverTCP(t *testing.T) {
	for _, c := range []struct {
		ranks, seq, d int
		causal        bool
	}{{1, 6, 5, true}, {2, 12, 7, true}, {3, 18, 4, false}, {4, 24, 9, true}} {
		t.Run(fmt.Sprintf("P=%d/causal=%v", c.ranks, c.causal), func(t *testing.T) {
			dir, port := t.TempDir(), testnet.FreePort(t)
			cmds := make([]*exec.Cmd, c.ranks)
			for rank := range c.ranks {
				cmd := exec.Command(os.Args[0], "-test.run=^$")
				cmd.Env = append(os.Environ(), "ZAYA_RING_CHILD=1",
					"RANK="+strconv.Itoa(rank), "WORLD_SIZE="+strconv.Itoa(c.ranks),
					"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+port,
					"ZAYA_SEQ="+strconv.Itoa(c.seq), "ZAYA_DIM="+strconv.Itoa(c.d),
					"ZAYA_CAUSAL="+map[bool]string{true: "1", false: "0"}[c.causal],
					"ZAYA_OUT="+filepath.Join(dir, strconv.Itoa(rank)))
				cmd.Stderr = os.Stderr
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				cmds[rank] = cmd
			}
			for rank, cmd := range cmds {
				if err := cmd.Wait(); err != nil {
					t.Fatalf("rank %d: %v", rank, err)
				}
			}
			q, k, v := problem(c.seq, c.d)
			want, wantLSE := attention.Reference(q, k, v, c.causal, 1/math.Sqrt(float64(c.d)))
			l := Layout{Seq: c.seq, Ranks: c.ranks}
			for rank := range c.ranks {
				b, err := os.ReadFile(filepath.Join(dir, strconv.Itoa(rank)))
				if err != nil {
					t.Fatal(err)
				}
				var got childResult
				if err := json.Unmarshal(b, &got); err != nil {
					t.Fatal(err)
				}
				for i, p := range l.Positions(rank) {
					if math.Abs(got.LSE[i]-wantLSE[p]) > tol*(1+math.Abs(wantLSE[p])) {
						t.Fatalf("rank %d token %d: lse %v, want %v", rank, p, got.LSE[i], wantLSE[p])
					}
					for j := range c.d {
						if g := float64(got.Out[i*c.d+j]); math.Abs(g-want[p][j]) > tol*(1+math.Abs(want[p][j])) {
							t.Fatalf("rank %d token %d dim %d: %v, want %v", rank, p, j, g, want[p][j])
						}
					}
				}
			}
		})
	}
}

func TestKVWireRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	k, v := randomMatrix(r, 3, 5), randomMatrix(r, 3, 2)
	gk, gv, err := decodeKV(encodeKV(k, v))
	if err != nil || fmt.Sprint(gk) != fmt.Sprint(k) || fmt.Sprint(gv) != fmt.Sprint(v) {
		t.Fatalf("round trip: %v", err)
	}
	if _, _, err := decodeKV(encodeKV(k, v)[:20]); err == nil {
		t.Error("a truncated block was accepted")
	}
}
