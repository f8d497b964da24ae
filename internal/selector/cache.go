package selector

import (
	"regexp"
	"regexp/syntax"
	"sync"
)

// compiled is a pattern ready to match.
type compiled struct {
	re *regexp.Regexp
	// literal is set when the pattern can only match one string: most
	// patterns are plain words, and comparing strings is much cheaper than
	// running a regexp over every image of a catalog.
	literal   string
	isLiteral bool
}

func (c *compiled) match(s string) bool {
	if c.isLiteral {
		return s == c.literal
	}
	return c.re.MatchString(s)
}

// Rendering many clusters parses the same few patterns over and over (every
// level of every cluster finalizes with the same k8s-version pattern), and
// compiling a regexp costs more than matching it against a whole catalog.
// A compiled *regexp.Regexp is safe for concurrent use, so one copy can be
// shared. The cache stops growing at maxCached patterns so that a
// long-running process fed arbitrary patterns keeps bounded memory; past
// that, patterns are compiled each time, which is only slower.
const maxCached = 4096

var cache struct {
	sync.RWMutex
	m map[string]*compiled
}

func compile(pattern string) (*compiled, error) {
	cache.RLock()
	c, ok := cache.m[pattern]
	cache.RUnlock()
	if ok {
		return c, nil
	}
	// Checking the pattern on its own first keeps it from escaping the
	// anchors: "a)|(b" would otherwise compile as "^(a)|(b)$" and match
	// any string starting with a.
	parsed, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return nil, err
	}
	re, err := regexp.Compile("^(" + pattern + ")$")
	if err != nil {
		return nil, err
	}
	c = &compiled{re: re}
	parsed = parsed.Simplify()
	switch {
	case parsed.Op == syntax.OpLiteral && parsed.Flags&syntax.FoldCase == 0:
		c.literal, c.isLiteral = string(parsed.Rune), true
	case parsed.Op == syntax.OpEmptyMatch:
		c.literal, c.isLiteral = "", true
	}
	cache.Lock()
	if cache.m == nil {
		cache.m = make(map[string]*compiled)
	}
	if len(cache.m) < maxCached {
		cache.m[pattern] = c
	}
	cache.Unlock()
	return c, nil
}
