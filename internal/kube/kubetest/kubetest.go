// Package kubetest adapts a client-go clientset, in tests the fake one, to
// kube.Interface and managerapi.Interface. It is for tests only: importing client-go's clientset is
// what package kube exists to avoid in the driver's binary.
package kubetest

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/watchlist"

	"github.com/pods-as-volumes/pav/internal/kube"
	"github.com/pods-as-volumes/pav/internal/kube/managerapi"
)

// Wrap is c as a kube.Interface; nil stays nil ("no Kubernetes" to the
// servers).
func Wrap(c kubernetes.Interface) kube.Interface {
	if c == nil {
		return nil
	}
	return clientset{c}
}

type clientset struct{ c kubernetes.Interface }

func (c clientset) Pods(ns string) kube.Pods { return c.c.CoreV1().Pods(ns) }

func (c clientset) PersistentVolumes() kube.Resource[*corev1.PersistentVolume, *corev1.PersistentVolumeList] {
	return c.c.CoreV1().PersistentVolumes()
}

func (c clientset) PersistentVolumeClaims(ns string) kube.Resource[*corev1.PersistentVolumeClaim, *corev1.PersistentVolumeClaimList] {
	return c.c.CoreV1().PersistentVolumeClaims(ns)
}

func (c clientset) Nodes() kube.Resource[*corev1.Node, *corev1.NodeList] { return c.c.CoreV1().Nodes() }

func (c clientset) StorageClasses() kube.Resource[*storagev1.StorageClass, *storagev1.StorageClassList] {
	return c.c.StorageV1().StorageClasses()
}

func (c clientset) VolumeAttributesClasses() kube.Resource[*storagev1.VolumeAttributesClass, *storagev1.VolumeAttributesClassList] {
	return c.c.StorageV1().VolumeAttributesClasses()
}

func (c clientset) EventSink() record.EventSink {
	return &typedcorev1.EventSinkImpl{Interface: c.c.CoreV1().Events("")}
}

// IsWatchListSemanticsUnSupported passes on what the clientset says (the
// fake one: true), for kube.NewInformer.
func (c clientset) IsWatchListSemanticsUnSupported() bool {
	return watchlist.DoesClientNotSupportWatchListSemantics(c.c)
}

func (c clientset) ServerVersion(context.Context) (*version.Info, error) {
	return c.c.Discovery().ServerVersion()
}

// WrapManager is c as a managerapi.Interface; nil stays nil.
func WrapManager(c kubernetes.Interface) managerapi.Interface {
	if c == nil {
		return nil
	}
	return managerClientset{clientset{c}}
}

type managerClientset struct{ clientset }

func (c managerClientset) CSIDrivers() managerapi.Applied[*storagev1.CSIDriver, *storagev1.CSIDriverList] {
	return c.c.StorageV1().CSIDrivers()
}

func (c managerClientset) StatefulSets(ns string) managerapi.Applied[*appsv1.StatefulSet, *appsv1.StatefulSetList] {
	return c.c.AppsV1().StatefulSets(ns)
}

func (c managerClientset) DaemonSets(ns string) managerapi.Applied[*appsv1.DaemonSet, *appsv1.DaemonSetList] {
	return c.c.AppsV1().DaemonSets(ns)
}

func (c managerClientset) Services(ns string) managerapi.Applied[*corev1.Service, *corev1.ServiceList] {
	return c.c.CoreV1().Services(ns)
}

func (c managerClientset) Secrets(ns string) managerapi.Readable[*corev1.Secret, *corev1.SecretList] {
	return c.c.CoreV1().Secrets(ns)
}
