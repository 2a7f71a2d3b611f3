package records_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	k8stesting "k8s.io/client-go/testing"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/records"
	"github.com/pods-as-volumes/pav/internal/records/recordstest"
)

const inlineID = "csi-0d4f6b3b2f0e7c1a9b8e5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a"

func inline(node string) *v1alpha1.PavVolume {
	v := newVolume(inlineID)
	v.Spec.Ephemeral = &v1alpha1.EphemeralVolume{Node: node, Pod: v1alpha1.EphemeralPod{Namespace: "ns", Name: "p", UID: "u"}}
	return v
}

// TestNodeStore: a node plugin reads its inline volumes' records by name
// (never a list or a watch), writes only its own node's, and labels them
// with the node.
func TestNodeStore(t *testing.T) {
	ctx := context.Background()
	c := recordstest.NewClient()
	s := records.NewNodeStore(c, "hello", "vm-2")

	if v, err := s.Get(ctx, inlineID); v != nil || err != nil {
		t.Fatalf("Get of nothing: %v %v", v, err)
	}
	if _, err := s.Create(ctx, newVolume("pvc-1")); err == nil || !strings.Contains(err.Error(), "writes only the PavVolumes of its own inline volumes") {
		t.Fatalf("a persistent volume's record: %v", err)
	}
	if _, err := s.Create(ctx, inline("vm-3")); err == nil {
		t.Fatal("another node's record was written")
	}
	v, err := s.Create(ctx, inline("vm-2"))
	if err != nil {
		t.Fatal(err)
	}
	if v.Name != inlineID || v.Spec.Provisioner != "hello" || v.Labels[v1alpha1.LabelVolumeNode] != "vm-2" || v.Labels[v1alpha1.LabelVolumeProvisioner] != "hello" {
		t.Fatalf("created %s %+v %v", v.Name, v.Spec, v.Labels)
	}
	v.Status.Phase, v.Status.Handle = v1alpha1.VolumeCreated, inlineID
	if v, err = s.Update(ctx, v); err != nil || v.Labels[v1alpha1.LabelVolumeHandle] != v1alpha1.HandleLabel(inlineID) {
		t.Fatalf("update: %v %v", err, v.Labels)
	}
	if got, err := s.ByHandle(ctx, inlineID, false); err != nil || len(got) != 1 || got[0].ResourceVersion != v.ResourceVersion {
		t.Fatalf("ByHandle: %v %v", got, err)
	}
	// A stale write is refused (resourceVersion).
	stale := v.DeepCopy()
	stale.ResourceVersion = "1"
	if _, err := s.Update(ctx, stale); err == nil {
		t.Fatal("stale update accepted")
	}
	// Another node's plugin (or provisioner's) does not take it for its own.
	if _, err := records.NewNodeStore(c, "hello", "vm-3").Get(ctx, inlineID); !errors.Is(err, records.ErrOtherOwner) {
		t.Fatalf("another node: %v", err)
	}
	if _, err := records.NewNodeStore(c, "other", "vm-2").Get(ctx, inlineID); !errors.Is(err, records.ErrOtherOwner) {
		t.Fatalf("another provisioner: %v", err)
	}
	if err := s.Delete(ctx, v); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, v); err != nil {
		t.Fatalf("deleting again: %v", err)
	}
	for _, a := range c.Actions() {
		if a.GetVerb() == "list" || a.GetVerb() == "watch" {
			t.Errorf("the node store made a %s (the node plugin may not)", a.GetVerb())
		}
		if d, ok := a.(k8stesting.DeleteAction); ok && d.GetDeleteOptions().Preconditions == nil {
			t.Error("a delete without a UID precondition")
		}
	}
}
