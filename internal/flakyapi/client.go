package flakyapi

import (
	"context"
	"math/rand/v2"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// ClientFaults says how often the writes of an intercepted client misbehave.
type ClientFaults struct {
	Conflict    float64 // updates and patches refused with 409 Conflict, nothing written
	AfterCommit float64 // any write done, then reported as a server timeout
}

// Client-side fault kinds, for Counts.
const (
	Conflicts   Kind = "conflict"
	AfterCommit Kind = "after-commit"
)

// Interceptor wraps c so that its writes conflict or lose their answers at the given rates.
// Reads pass through (a manager's reads come from its cache anyway).
type Interceptor struct {
	mu     sync.Mutex
	rnd    *rand.Rand
	faults ClientFaults
	counts map[Kind]int
}

// NewInterceptor makes an interceptor with a reproducible fault sequence.
func NewInterceptor(f ClientFaults, seed uint64) *Interceptor {
	return &Interceptor{rnd: rand.New(rand.NewPCG(seed, ^seed)), faults: f, counts: map[Kind]int{}}
}

// SetFaults changes the rates from the next write on.
func (i *Interceptor) SetFaults(f ClientFaults) {
	i.mu.Lock()
	i.faults = f
	i.mu.Unlock()
}

// Counts is how many writes met each fault so far.
func (i *Interceptor) Counts() map[Kind]int {
	i.mu.Lock()
	defer i.mu.Unlock()
	out := make(map[Kind]int, len(i.counts))
	for k, v := range i.counts {
		out[k] = v
	}
	return out
}

// roll picks the fault for one write; mayConflict is false for creates and deletes.
func (i *Interceptor) roll(mayConflict bool) Kind {
	i.mu.Lock()
	defer i.mu.Unlock()
	x := i.rnd.Float64()
	switch { // each enabled fault at least once, as the proxy does
	case mayConflict && i.faults.Conflict > 0 && i.counts[Conflicts] == 0:
		x = 0
	case i.faults.AfterCommit > 0 && i.counts[AfterCommit] == 0:
		x = i.faults.Conflict
	}
	k := Forwarded
	switch {
	case mayConflict && x < i.faults.Conflict:
		k = Conflicts
	case x < i.faults.Conflict+i.faults.AfterCommit:
		k = AfterCommit
	}
	i.counts[k]++
	return k
}

// write runs do under the fault rolled for it.
func (i *Interceptor) write(obj client.Object, mayConflict bool, do func() error) error {
	switch i.roll(mayConflict) {
	case Conflicts:
		return apierrors.NewConflict(schema.GroupResource{Resource: "intercepted"}, obj.GetName(),
			errInjected("the object has been modified"))
	case AfterCommit:
		if err := do(); err != nil {
			return err
		}
		return apierrors.NewServerTimeout(schema.GroupResource{Resource: "intercepted"}, "write", 0)
	}
	return do()
}

type errInjected string

func (e errInjected) Error() string { return "injected: " + string(e) }

// Wrap returns c with faulty writes.
func (i *Interceptor) Wrap(c client.WithWatch) client.WithWatch {
	return interceptor.NewClient(c, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			return i.write(obj, false, func() error { return c.Create(ctx, obj, opts...) })
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			return i.write(obj, false, func() error { return c.Delete(ctx, obj, opts...) })
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			return i.write(obj, true, func() error { return c.Update(ctx, obj, opts...) })
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			return i.write(obj, true, func() error { return c.Patch(ctx, obj, patch, opts...) })
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			return i.write(obj, true, func() error { return c.SubResource(sub).Update(ctx, obj, opts...) })
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			return i.write(obj, true, func() error { return c.SubResource(sub).Patch(ctx, obj, patch, opts...) })
		},
	})
}
