package testcontainers

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	tc "github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// BrowserImage is the headless Chromium image tests drive through the
// DevTools protocol, built from Debian's chromium package by
// peerimage/build.sh on first use (MEFOR_BROWSER_IMAGE overrides it).
const BrowserImage = "mefor-chromium:1"

// BrowserPackages are the Debian packages of BrowserImage: the browser,
// a font, so pages render text the same on every machine, and dbus-x11,
// named because debootstrap does not resolve the virtual
// dbus-session-bus that chromium's GTK dependencies need.
var BrowserPackages = []string{"chromium", "fonts-dejavu-core", "dbus-x11"}

// Browser is a headless Chromium running in a container.
type Browser struct {
	ctr *tc.DockerContainer
	// DevTools is host:port of its remote debugging endpoint, for
	// chromedp.NewRemoteAllocator("ws://" + DevTools).
	DevTools string
	hostNet  bool
}

// ListenAddr is where a test's server should listen for the browser to
// reach it: loopback when the browser shares this host's network, every
// address when it reaches the host through its gateway.
func (b *Browser) ListenAddr() string {
	if b.hostNet {
		return "127.0.0.1:0"
	}
	return "0.0.0.0:0"
}

// Origin is http://host:port as the browser names a server listening on
// addr (from ListenAddr).
func (b *Browser) Origin(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	if b.hostNet {
		return "http://127.0.0.1:" + port
	}
	return "http://host.docker.internal:" + port
}

var (
	browserMu  sync.Mutex
	browser    *Browser
	browserErr error
)

// SharedBrowser is one browser for the whole test binary, started on
// first use and stopped when testcontainers.Main ends: Chromium takes a
// few seconds to start, and tests isolate themselves with a browser
// context each (chromedp.WithNewBrowserContext). It never skips: a
// machine that cannot run it fails the test.
func SharedBrowser(t testing.TB) *Browser {
	t.Helper()
	if !mainActive.Load() {
		t.Fatal("testcontainers.SharedBrowser needs TestMain to call testcontainers.Main(m)")
	}
	browserMu.Lock()
	defer browserMu.Unlock()
	if browser == nil && browserErr == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		browser, browserErr = StartBrowser(ctx)
		if browserErr == nil {
			atExit(func(ctx context.Context) { browser.Close(ctx) })
		}
	}
	if browserErr != nil {
		t.Fatal(browserErr)
	}
	return browser
}

// StartBrowser builds the image if needed and starts Chromium, labelled
// like the PostgreSQL containers so a dead test's browser is swept.
// Where the Docker engine shares this network namespace the browser uses
// the host network (it then reaches a server on 127.0.0.1); elsewhere it
// reaches the host as host.docker.internal through the host gateway.
func StartBrowser(ctx context.Context) (*Browser, error) {
	configure()
	image := os.Getenv("MEFOR_BROWSER_IMAGE")
	if image == "" {
		image = BrowserImage
	}
	if err := BuildPeerImage(ctx, image, BrowserPackages...); err != nil {
		return nil, err
	}
	sweepStale(ctx)
	b := &Browser{hostNet: engineIsLocal()}
	port, bind := "9222", "0.0.0.0"
	if b.hostNet {
		p, err := freeLoopbackPort()
		if err != nil {
			return nil, err
		}
		port, bind = p, "127.0.0.1"
	}
	host, _ := os.Hostname()
	// --no-sandbox: the container runs it as root, which Chromium's
	// sandbox refuses; the container is the sandbox. /dev/shm is small in
	// a container, hence --disable-dev-shm-usage. Recent Chromium serves
	// remote debugging only with a user data directory of its own.
	cmd := []string{"chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--remote-debugging-address=" + bind, "--remote-debugging-port=" + port, "--user-data-dir=/tmp/chromium",
		"--no-first-run", "--no-default-browser-check", "--hide-scrollbars", "--mute-audio", "--force-color-profile=srgb",
		"--lang=en-US", "about:blank"}
	opts := []tc.ContainerCustomizer{
		tc.WithCmd(cmd...),
		tc.WithEnv(map[string]string{"TZ": "UTC"}),
		tc.WithWaitStrategy(wait.ForLog("DevTools listening on").WithOccurrence(1).WithStartupTimeout(2 * time.Minute)),
		tc.WithLabels(map[string]string{
			labelOwner:   "1",
			labelPID:     strconv.Itoa(os.Getpid()),
			labelHost:    host,
			labelStarted: strconv.FormatInt(time.Now().Unix(), 10),
		}),
		tc.WithHostConfigModifier(func(hc *container.HostConfig) {
			if b.hostNet {
				hc.NetworkMode = "host"
			} else {
				hc.ExtraHosts = append(hc.ExtraHosts, "host.docker.internal:host-gateway")
			}
		}),
	}
	if !b.hostNet {
		opts = append(opts, tc.WithExposedPorts(port+"/tcp"))
	}
	ctr, err := tc.Run(ctx, image, opts...)
	if err != nil {
		if ctr != nil {
			_ = ctr.Terminate(context.WithoutCancel(ctx))
		}
		return nil, fmt.Errorf("run %s: %w", image, err)
	}
	b.ctr, b.DevTools = ctr, "127.0.0.1:"+port
	if !b.hostNet {
		h, err := ctr.Host(ctx)
		if err != nil {
			return nil, err
		}
		mapped, err := ctr.MappedPort(ctx, port+"/tcp")
		if err != nil {
			return nil, err
		}
		b.DevTools = net.JoinHostPort(h, mapped.Port())
	}
	return b, nil
}

// Close stops the browser.
func (b *Browser) Close(ctx context.Context) {
	if b != nil && b.ctr != nil {
		_ = b.ctr.Terminate(ctx)
	}
}
