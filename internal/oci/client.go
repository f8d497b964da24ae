// Package oci is the oras-go plumbing shared by the catalog and the image
// server: one HTTP client per process (connection reuse, retries, TLS,
// proxy, credentials) and repository handles built on it.
package oci

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"oras.land/oras-go/v2/registry"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/credentials"
	"oras.land/oras-go/v2/registry/remote/retry"
)

// Options configure access to registries.
type Options struct {
	// Insecure allows plain HTTP and TLS without verification, as Sylva's
	// oci_registry_insecure does.
	Insecure bool
	// CAFile adds PEM CA certificates to the system pool.
	CAFile string
	// RegistryConfig is a Docker config.json with credentials. Empty means
	// Docker's default ($DOCKER_CONFIG/config.json or ~/.docker/config.json).
	RegistryConfig string
	// MaxConnsPerHost bounds the connections kept open to one registry.
	MaxConnsPerHost int
	// UserAgent is sent with every request.
	UserAgent string
}

// Client opens repositories. It is safe for concurrent use.
type Client struct {
	insecure bool
	auth     *auth.Client
	// http is auth's HTTP client without credentials: the transport (CA,
	// insecure, proxy, retries) for plain HTTP(S) downloads.
	http      *http.Client
	userAgent string
	// plainHTTP remembers the registries of an insecure setup that answered
	// HTTPS with plain HTTP, so that only their first request pays for it.
	plainHTTP sync.Map
}

// NewClient builds the shared HTTP stack: a transport honouring
// HTTPS_PROXY/NO_PROXY, retries with backoff on 408, 429, 5xx and timeouts
// (oras-go's retry policy), and credentials from a Docker config.
func NewClient(opts Options) (*Client, error) {
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: opts.Insecure} //nolint:gosec // the operator asked for it
	if opts.CAFile != "" {
		pem, err := os.ReadFile(opts.CAFile)
		if err != nil {
			return nil, fmt.Errorf("reading CA file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil || pool == nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s: no PEM certificate found in it", opts.CAFile)
		}
		tlsConfig.RootCAs = pool
	}
	conns := opts.MaxConnsPerHost
	if conns <= 0 {
		conns = 16
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.Proxy = http.ProxyFromEnvironment
	transport.TLSClientConfig = tlsConfig
	transport.MaxIdleConnsPerHost = conns
	transport.ResponseHeaderTimeout = 60 * time.Second

	var store credentials.Store
	var err error
	if opts.RegistryConfig != "" {
		if _, statErr := os.Stat(opts.RegistryConfig); statErr != nil {
			return nil, fmt.Errorf("registry config: %w", statErr)
		}
		store, err = credentials.NewStore(opts.RegistryConfig, credentials.StoreOptions{})
	} else {
		store, err = credentials.NewStoreFromDocker(credentials.StoreOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("loading registry credentials: %w", err)
	}

	ua := opts.UserAgent
	if ua == "" {
		ua = "osimages"
	}
	httpClient := &http.Client{Transport: retry.NewTransport(transport)}
	client := &auth.Client{
		Client:     httpClient,
		Cache:      auth.NewCache(),
		Credential: credentials.Credential(store),
		Header:     http.Header{"User-Agent": []string{ua}},
	}
	return &Client{insecure: opts.Insecure, auth: client, http: httpClient, userAgent: ua}, nil
}

// Clients are the two clients of one set of options: one that verifies
// TLS and one for oci_registry_insecure, which the values can switch while
// a process runs (the image server, the controller).
type Clients struct {
	Secure, Insecure *Client
}

// NewClients builds both clients of opts; opts.Insecure is not read.
func NewClients(opts Options) (Clients, error) {
	opts.Insecure = false
	secure, err := NewClient(opts)
	if err != nil {
		return Clients{}, err
	}
	opts.Insecure = true
	insecure, err := NewClient(opts)
	if err != nil {
		return Clients{}, err
	}
	return Clients{Secure: secure, Insecure: insecure}, nil
}

// ParseReference parses an image reference, with or without the oci://
// scheme, that must name a tag or a digest.
func ParseReference(uri string) (registry.Reference, error) {
	ref, err := registry.ParseReference(strings.TrimPrefix(uri, "oci://"))
	if err != nil {
		return registry.Reference{}, err
	}
	if ref.Reference == "" {
		return registry.Reference{}, fmt.Errorf("reference %q names no tag or digest", uri)
	}
	return ref, nil
}

// Do runs fn with a repository handle for ref. With Insecure set, a registry
// that answers HTTPS with plain HTTP is tried again over plain HTTP, and
// remembered as such.
func (c *Client) Do(ctx context.Context, ref registry.Reference, fn func(*remote.Repository) error) error {
	repo := c.repository(ref)
	err := fn(repo)
	if err != nil && c.insecure && !repo.PlainHTTP && isHTTPResponseToHTTPS(err) {
		c.plainHTTP.Store(ref.Registry, true)
		err = fn(c.repository(ref))
	}
	return err
}

func (c *Client) repository(ref registry.Reference) *remote.Repository {
	_, plain := c.plainHTTP.Load(ref.Registry)
	return &remote.Repository{
		Client:    c.auth,
		Reference: ref,
		PlainHTTP: plain,
		// Registries that do not support the referrers API are common; do
		// not probe it on every repository.
		SkipReferrersGC: true,
	}
}

func isHTTPResponseToHTTPS(err error) bool {
	var recordErr tls.RecordHeaderError
	return errors.As(err, &recordErr) || strings.Contains(err.Error(), "server gave HTTP response to HTTPS client")
}
