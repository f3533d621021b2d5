package testcontainers

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/moby/moby/client"
	tc "github.com/testcontainers/testcontainers-go"
)

// maxAge bounds how long a test container may live even if its owner looks
// alive (a recycled pid on a long-lived machine).
const maxAge = 3 * time.Hour

// sweepStale removes test containers left behind by test binaries that were
// killed before Main could stop them. It runs before every start; failures
// only cost disk and are logged.
func sweepStale(ctx context.Context) {
	cli, err := tc.NewDockerClientWithOpts(ctx)
	if err != nil {
		slog.Warn("sweep stale test containers: docker client", "error", err)
		return
	}
	defer cli.Close()
	res, err := cli.ContainerList(ctx, client.ContainerListOptions{
		All:     true,
		Filters: client.Filters{}.Add("label", labelOwner),
	})
	if err != nil {
		slog.Warn("sweep stale test containers: list", "error", err)
		return
	}
	host, _ := os.Hostname()
	for _, c := range res.Items {
		if !stale(c.Labels, host) {
			continue
		}
		if _, err := cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil {
			slog.Warn("sweep stale test containers: remove", "container", c.ID, "error", err)
		}
	}
}

func stale(labels map[string]string, host string) bool {
	if started, err := strconv.ParseInt(labels[labelStarted], 10, 64); err == nil &&
		time.Since(time.Unix(started, 0)) > maxAge {
		return true
	}
	if labels[labelHost] != host {
		return false // another machine's test run sharing this engine
	}
	pid, err := strconv.Atoi(labels[labelPID])
	if err != nil {
		return true
	}
	return !processAlive(pid)
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func imageExists(ctx context.Context, ref string) bool {
	cli, err := tc.NewDockerClientWithOpts(ctx)
	if err != nil {
		return false
	}
	defer cli.Close()
	_, err = cli.ImageInspect(ctx, ref)
	return err == nil
}
