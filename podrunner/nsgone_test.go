package podrunner_test

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	"github.com/pods-as-volumes/pav/internal/fakekubelet"
	"github.com/pods-as-volumes/pav/podrunner"
)

var podsGR = schema.GroupResource{Resource: "pods"}

// terminatingErr is the NamespaceLifecycle admission plugin's answer to a
// creation in a namespace being deleted.
func terminatingErr(ns, name string) error {
	err := apierrors.NewForbidden(podsGR, name, errors.New("unable to create new content in namespace "+ns+" because it is being terminated"))
	err.ErrStatus.Details.Causes = append(err.ErrStatus.Details.Causes, metav1.StatusCause{
		Type: corev1.NamespaceTerminatingCause, Message: "namespace " + ns + " is being terminated", Field: "metadata.namespace"})
	return err
}

// TestNamespaceGone: a pod that cannot be created because its namespace is
// being deleted (403, cause NamespaceTerminating) or does not exist (404 of
// the namespace) is a *NamespaceGoneError, told from the API's answer alone;
// any other refusal is not. A pod of ours already in a namespace being
// deleted is adopted, as any other.
func TestNamespaceGone(t *testing.T) {
	const ns = "team-a"
	for _, tc := range []struct {
		name        string
		refusal     func(name string) error
		ourPodThere bool
		gone        bool
		terminating bool
	}{
		{name: "namespace being deleted", refusal: func(name string) error { return terminatingErr(ns, name) }, gone: true, terminating: true},
		{name: "namespace missing", refusal: func(string) error { return apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, ns) }, gone: true},
		{name: "another namespace missing is not ours", refusal: func(string) error {
			return apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, "other")
		}},
		{name: "something else not found", refusal: func(string) error {
			return apierrors.NewNotFound(schema.GroupResource{Resource: "serviceaccounts"}, "default")
		}},
		{name: "forbidden for another reason (no ServiceAccount yet, quota)", refusal: func(name string) error {
			return apierrors.NewForbidden(podsGR, name, errors.New("error looking up service account team-a/default: serviceaccount \"default\" not found"))
		}},
		{name: "namespace being deleted with our pod in it: adopted", refusal: func(name string) error { return terminatingErr(ns, name) }, ourPodThere: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, always(fakekubelet.Outcome{Kind: fakekubelet.Succeed, Files: map[string]string{"handle": "h"}}), envOpts{})
			op := creationOp("pvc-nsgone")
			op.Template.Namespace = ns
			if tc.ourPodThere {
				// Created before the namespace began to go (its UID was
				// never recorded: a restart came in between).
				pod, err := e.runner.BuildPod(op)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := e.client.CoreV1().Pods(ns).Create(e.ctx, pod, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			e.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, tc.refusal(a.(k8stesting.CreateAction).GetObject().(*corev1.Pod).Name)
			})
			res, err := e.runner.Run(e.ctx, op)
			gone, isGone := podrunner.IsNamespaceGone(err)
			switch {
			case tc.ourPodThere:
				if err != nil || res.Files["handle"] != "h" {
					t.Fatalf("Run = %+v, %v; want our pod adopted", res, err)
				}
			case tc.gone:
				if !isGone || !errors.Is(err, podrunner.ErrNamespaceGone) || gone.Namespace != ns || gone.Terminating != tc.terminating || gone.Phase != "creation" {
					t.Fatalf("Run = %v (%+v), want the namespace gone, terminating %v", err, gone, tc.terminating)
				}
				if !strings.Contains(err.Error(), `its namespace "team-a"`) {
					t.Errorf("message %q does not name the namespace", err)
				}
			default:
				if isGone || errors.Is(err, podrunner.ErrNamespaceGone) || err == nil {
					t.Fatalf("Run = %v, want an error that is not the namespace gone", err)
				}
			}
		})
	}
}
