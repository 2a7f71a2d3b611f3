// Command pause is the sandbox ("infra") container of the local test cluster,
// a Go stand-in for registry.k8s.io/pause (hack/images/build.sh tags it
// registry.k8s.io/pause:3.10). It sleeps forever, reaps every child that is
// reparented to it (it is PID 1 when the pod shares its PID namespace) and
// exits 0 on SIGTERM or SIGINT. Build it static: CGO_ENABLED=0.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

const version = "3.10-pav"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("pause.go", version)
		return
	}
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "Warning: pause should be the first process")
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		switch sig {
		case syscall.SIGCHLD:
			reap()
		default:
			fmt.Fprintf(os.Stderr, "Shutting down, got signal: %v\n", sig)
			os.Exit(0)
		}
	}
}

// reap collects every exited child without blocking.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
