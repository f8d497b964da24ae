// Package devregistry runs a real OCI registry (CNCF distribution) in-process
// on 127.0.0.1, and publishes diskimage-builder-like artifacts into it. The
// demo uses it as its embedded default and the tests as their registry, so
// that both exercise the same HTTP path a production registry does.
package devregistry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	"github.com/sirupsen/logrus"
	"golang.org/x/crypto/bcrypt"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"

	// Storage driver and access controller, registered by name.
	_ "github.com/distribution/distribution/v3/registry/auth/htpasswd"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
)

// Options shape the registry. The zero value is a plain-HTTP, anonymous,
// in-memory registry.
type Options struct {
	// TLS serves HTTPS with a certificate from a CA made for this registry.
	TLS bool
	// Username and Password, when set, require HTTP basic auth.
	Username, Password string
	// RootDirectory stores blobs on disk instead of in memory.
	RootDirectory string
	// Middleware wraps the registry handler, for fault injection in tests.
	Middleware func(http.Handler) http.Handler
}

// Registry is a running registry.
type Registry struct {
	// Host is host:port, as it appears in image references.
	Host string
	// CAFile is the PEM file of the CA that signed the server certificate,
	// when Options.TLS is set.
	CAFile string

	opts   Options
	caPool *x509.CertPool
	server *http.Server
	done   chan struct{}
	tmp    string
}

// Start listens on a free port of 127.0.0.1 and serves until Close.
func Start(ctx context.Context, opts Options) (*Registry, error) {
	// distribution logs every request through logrus' global logger.
	logrus.SetOutput(io.Discard)

	tmp, err := os.MkdirTemp("", "osimages-registry-")
	if err != nil {
		return nil, err
	}
	r := &Registry{opts: opts, tmp: tmp, done: make(chan struct{})}
	fail := func(err error) (*Registry, error) {
		os.RemoveAll(tmp)
		return nil, err
	}

	cfg := &configuration.Configuration{}
	cfg.Log.AccessLog.Disabled = true
	cfg.HTTP.Secret = "osimages-devregistry"
	cfg.Storage = configuration.Storage{"inmemory": configuration.Parameters{}}
	if opts.RootDirectory != "" {
		cfg.Storage = configuration.Storage{"filesystem": configuration.Parameters{"rootdirectory": opts.RootDirectory}}
	}
	cfg.Storage["delete"] = configuration.Parameters{"enabled": true}
	cfg.Storage["maintenance"] = configuration.Parameters{"uploadpurging": map[any]any{"enabled": false}}
	if opts.Username != "" {
		htpasswd := filepath.Join(tmp, "htpasswd")
		hash, err := bcrypt.GenerateFromPassword([]byte(opts.Password), bcrypt.MinCost)
		if err != nil {
			return fail(err)
		}
		if err := os.WriteFile(htpasswd, []byte(opts.Username+":"+string(hash)+"\n"), 0o600); err != nil {
			return fail(err)
		}
		cfg.Auth = configuration.Auth{"htpasswd": configuration.Parameters{"realm": "osimages-devregistry", "path": htpasswd}}
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(fmt.Errorf("devregistry: listening on 127.0.0.1: %w", err))
	}
	r.Host = ln.Addr().String()

	var handler http.Handler = handlers.NewApp(ctx, cfg)
	if opts.Middleware != nil {
		handler = opts.Middleware(handler)
	}
	r.server = &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		// Tests provoke TLS failures on purpose; they are asserted on the
		// client side.
		ErrorLog: log.New(io.Discard, "", 0),
	}

	if opts.TLS {
		cert, caPEM, pool, err := newServerCert()
		if err != nil {
			ln.Close()
			return fail(err)
		}
		r.caPool = pool
		r.CAFile = filepath.Join(tmp, "ca.pem")
		if err := os.WriteFile(r.CAFile, caPEM, 0o600); err != nil {
			ln.Close()
			return fail(err)
		}
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	}

	go func() {
		defer close(r.done)
		if err := r.server.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logrus.StandardLogger().Errorf("devregistry: %v", err)
		}
	}()
	return r, nil
}

// Close stops the registry and removes its files.
func (r *Registry) Close() error {
	err := r.server.Close()
	<-r.done
	os.RemoveAll(r.tmp)
	return err
}

// URL is the base URL of the registry API.
func (r *Registry) URL() string {
	if r.opts.TLS {
		return "https://" + r.Host
	}
	return "http://" + r.Host
}

// Repository returns an oras-go client for repo on this registry, trusting
// its CA and carrying its credentials.
func (r *Registry) Repository(repo string) (*remote.Repository, error) {
	rep, err := remote.NewRepository(r.Host + "/" + repo)
	if err != nil {
		return nil, err
	}
	rep.PlainHTTP = !r.opts.TLS
	transport := http.DefaultTransport.(*http.Transport).Clone()
	if r.caPool != nil {
		transport.TLSClientConfig = &tls.Config{RootCAs: r.caPool, MinVersion: tls.VersionTLS12}
	}
	client := &auth.Client{Client: &http.Client{Transport: transport}, Cache: auth.NewCache()}
	if r.opts.Username != "" {
		client.Credential = auth.StaticCredential(r.Host, auth.Credential{Username: r.opts.Username, Password: r.opts.Password})
	}
	rep.Client = client
	return rep, nil
}
