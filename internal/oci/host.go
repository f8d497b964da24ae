package oci

import (
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// CanonicalHost returns the form of a registry host (host or host:port)
// under which two spellings that reach the same registry compare equal:
// lower case, no trailing dot, no default port (443 or 80), an
// IPv4-mapped IPv6 address as IPv4, IPv4 in any form inet_aton accepts
// (127.1, 0x7f000001) as dotted decimal, and the addresses that localhost
// names (127.0.0.1 and ::1, and the unspecified 0.0.0.0 and ::, which a
// connection takes for them), and localhost, as "localhost". It
// over-merges ports on purpose (port 80 and 443 of a host are one): it
// decides which signing keys apply to an image, and one key too many only
// asks for a signature. Beyond the loopback that localhost names, it never
// merges two addresses: the rest of 127.0.0.0/8 are other hosts (a
// listener on 127.0.0.2 is not one on 127.0.0.1), and the fleet's registry
// policy admits hosts by this form.
// Names that DNS maps to the same address are not merged: that needs a
// resolver, and a resolver can lie.
func CanonicalHost(hostport string) string {
	h := strings.ToLower(hostport)
	host, port, err := net.SplitHostPort(h)
	if err != nil {
		host, port = h, ""
	}
	host = strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"), ".")
	if port == "443" || port == "80" {
		port = ""
	}
	host = canonicalAddress(host)
	if port == "" {
		if strings.Contains(host, ":") {
			return "[" + host + "]"
		}
		return host
	}
	return net.JoinHostPort(host, port)
}

var localhostV4 = netip.AddrFrom4([4]byte{127, 0, 0, 1})

func canonicalAddress(host string) string {
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return "localhost"
	}
	if zone := strings.IndexByte(host, '%'); zone >= 0 {
		host = host[:zone]
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		a, ok := parseInetAton(host)
		if !ok {
			return host
		}
		addr = a
	}
	addr = addr.Unmap()
	if addr == localhostV4 || addr == netip.IPv6Loopback() || addr.IsUnspecified() {
		return "localhost"
	}
	return addr.String()
}

// parseInetAton reads the IPv4 forms that C resolvers accept besides
// dotted decimal: one to four parts, each decimal, octal (leading 0) or
// hexadecimal (0x), the last filling the remaining bytes.
func parseInetAton(s string) (netip.Addr, bool) {
	parts := strings.Split(s, ".")
	if len(parts) == 0 || len(parts) > 4 {
		return netip.Addr{}, false
	}
	var vals []uint64
	for _, p := range parts {
		if p == "" {
			return netip.Addr{}, false
		}
		v, err := strconv.ParseUint(p, 0, 32)
		if err != nil {
			return netip.Addr{}, false
		}
		vals = append(vals, v)
	}
	var ip uint64
	for i, v := range vals[:len(vals)-1] {
		if v > 0xff {
			return netip.Addr{}, false
		}
		ip |= v << (24 - 8*i)
	}
	last := vals[len(vals)-1]
	if bits := 32 - 8*(len(vals)-1); last >= 1<<bits {
		return netip.Addr{}, false
	}
	ip |= last
	return netip.AddrFrom4([4]byte{byte(ip >> 24), byte(ip >> 16), byte(ip >> 8), byte(ip)}), true
}

// CanonicalRepository returns "host/repository" of an oci:// URI or a
// registry url (with or without a tag or digest), the host in canonical
// form and the path in lower case (repository names are lower case). ok is
// false when uri is not oci://.
func CanonicalRepository(uri string) (string, bool) {
	rest, found := strings.CutPrefix(uri, "oci://")
	if !found {
		return "", false
	}
	host, path, _ := strings.Cut(rest, "/")
	if i := strings.IndexByte(path, '@'); i >= 0 {
		path = path[:i]
	} else if i := strings.LastIndexByte(path, ':'); i >= 0 && !strings.Contains(path[i:], "/") {
		path = path[:i]
	}
	path = strings.Trim(strings.ToLower(path), "/")
	if path == "" {
		return CanonicalHost(host), true
	}
	return CanonicalHost(host) + "/" + path, true
}
