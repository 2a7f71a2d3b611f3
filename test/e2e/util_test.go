//go:build e2e

package e2e

import "context"

func bgCtx() context.Context { return context.Background() }
