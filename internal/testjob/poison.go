package testjob

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// PoisonPill is a job that Go cannot decode, as a schema looser than ours (an older CRD, a
// restore from backup, a schema bug) would store it.
type PoisonPill struct {
	// Name is the pill's job name suffix.
	Name string
	// Patch is a JSON merge patch, in YAML, onto a valid job.
	Patch string
	// Field is the path the operator must name.
	Field string
}

// PoisonPills are one of each kind of value the operator's job watch must survive.
var PoisonPills = []PoisonPill{
	{"duration", `{spec: {faultTolerance: {hangTimeout: 3000000h}}}`, "spec.faultTolerance.hangTimeout"},
	{"port", `{spec: {template: {spec: {containers: [{name: worker, image: zaya-worker:test, livenessProbe: {httpGet: {port: 99999999999}}}]}}}}`,
		"spec.template.spec.containers[0].livenessProbe.httpGet.port"},
	// resource.ParseQuantity takes hours over this one, its memory growing.
	{"quantity", `{spec: {template: {spec: {containers: [{name: worker, image: zaya-worker:test, resources: {limits: {cpu: "1e-999999999"}}}]}}}}`,
		"spec.template.spec.containers[0].resources.limits[cpu]"},
	{"type", `{spec: {nodes: four}}`, "spec.nodes"},
}

// Job is the stored pill: job with the pill's patch applied, named <job>-<pill>.
func (p PoisonPill) Job(job *trainingv1alpha1.ZayaTrainingJob) (*unstructured.Unstructured, error) {
	base, err := json.Marshal(job)
	if err != nil {
		return nil, err
	}
	patch, err := yaml.YAMLToJSON([]byte(p.Patch))
	if err != nil {
		return nil, fmt.Errorf("pill %s: %w", p.Name, err)
	}
	merged, err := jsonpatch.MergePatch(base, patch)
	if err != nil {
		return nil, fmt.Errorf("pill %s: %w", p.Name, err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(merged); err != nil {
		return nil, err
	}
	u.SetName(job.Name + "-" + p.Name)
	return u, nil
}

var crdGVK = schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"}

// LoosenSchema replaces the served schema of the job's spec and status with one that stores
// anything, and returns what puts the original back. The API server serves the new schema a
// moment after the update: retry creates.
func LoosenSchema(ctx context.Context, c client.Client) (restore func(context.Context) error, err error) {
	key := client.ObjectKey{Name: "zayatrainingjobs." + trainingv1alpha1.GroupVersion.Group}
	crd := &unstructured.Unstructured{}
	crd.SetGroupVersionKind(crdGVK)
	if err := c.Get(ctx, key, crd); err != nil {
		return nil, err
	}
	versions, _, err := unstructured.NestedSlice(crd.Object, "spec", "versions")
	if err != nil {
		return nil, err
	}
	if len(versions) == 0 {
		return nil, fmt.Errorf("CRD %s serves no versions", key.Name)
	}
	saved := runtime.DeepCopyJSONValue(versions).([]any)
	loose := runtime.DeepCopyJSONValue(versions).([]any)
	for _, v := range loose {
		for _, part := range []string{"spec", "status"} {
			if err := unstructured.SetNestedField(v.(map[string]any), map[string]any{
				"type": "object", "x-kubernetes-preserve-unknown-fields": true,
			}, "schema", "openAPIV3Schema", "properties", part); err != nil {
				return nil, err
			}
		}
	}
	set := func(ctx context.Context, v []any) error {
		crd := &unstructured.Unstructured{}
		crd.SetGroupVersionKind(crdGVK)
		if err := c.Get(ctx, key, crd); err != nil {
			return err
		}
		if err := unstructured.SetNestedSlice(crd.Object, v, "spec", "versions"); err != nil {
			return err
		}
		return c.Update(ctx, crd)
	}
	if err := set(ctx, loose); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { return set(ctx, saved) }, nil
}

// StorePoisonPills stores copies of every pill, made from jobs named <prefix><i> in ns, through
// a loosened schema that it restores before returning. It returns the stored pills (delete
// them unstructured: a typed delete would decode the response), in the order
// PoisonPills[i % len(PoisonPills)].
func StorePoisonPills(ctx context.Context, c client.Client, ns, prefix string, copies int) (pills []*unstructured.Unstructured, err error) {
	restore, err := LoosenSchema(ctx, c)
	if err != nil {
		return nil, err
	}
	defer func() {
		if rerr := restore(ctx); err == nil {
			err = rerr
		}
	}()
	for i := range copies {
		for _, p := range PoisonPills {
			u, err := p.Job(MakeZayaTrainingJob(fmt.Sprintf("%s%d", prefix, i), ns).Defaulted().Obj())
			if err != nil {
				return pills, err
			}
			// The API server serves the loose schema a moment after the update.
			err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
				return c.Create(ctx, u.DeepCopy()) == nil, nil
			})
			if err != nil {
				return pills, fmt.Errorf("storing pill %s: %w", u.GetName(), err)
			}
			pills = append(pills, u)
		}
	}
	return pills, nil
}
