#!/usr/bin/env bash
# Counts the lines of product code and of tests, per package and in all,
# and prints the ratio of tests to code (docs/development.md, "How much is
# tested"). Lines are all lines of the .go files, comments and blank lines
# included, of the files git tracks or would track.
#
#   code   every non-test .go file under internal/ and cmd/, except
#          internal/testenv (test support: only tests import it)
#   tests  every *_test.go file of the repository, internal/testenv, and
#          the non-test .go files under test/ (programs the end-to-end
#          tests build and run)
#   bench  the non-test .go files under bench/ (benchmark harnesses),
#          counted as code in the second total
#
# hack/ (build and test tooling) counts as neither.
#
#   hack/linecount.sh            # per package, then the totals
#   hack/linecount.sh -total     # the totals alone
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# "KIND DIR LINES" for each file.
counts=$(git ls-files -z --cached --others --exclude-standard -- '*.go' | xargs -0 wc -l | awk '
	$2 == "total" { next }
	{
		f = $2
		if (f ~ /_test\.go$/ || f ~ /^internal\/testenv\// || f ~ /^test\//) kind = "tests"
		else if (f ~ /^(internal|cmd)\//) kind = "code"
		else if (f ~ /^bench\//) kind = "bench"
		else next
		dir = f; sub(/\/[^\/]*$/, "", dir)
		print kind, dir, $1
	}')

if [ "${1:-}" != -total ]; then
	printf '%-40s %7s %7s %6s\n' package code tests ratio
	awk '{ if ($1 == "tests") t[$2] += $3; else c[$2] += $3; seen[$2] = 1 }
		END { for (p in seen) printf "%-40s %7d %7d %6s\n", p, c[p], t[p], (c[p] > 0 ? sprintf("%.2f", t[p] / c[p]) : "-") }' <<<"$counts" | sort
	echo
fi
awk '{ n[$1] += $3 }
	END {
		printf "code (internal/ and cmd/, without internal/testenv) %d, tests %d: %.2fx\n", n["code"], n["tests"], n["tests"] / n["code"]
		printf "code with bench/ (%d lines) %d, tests %d: %.2fx\n", n["bench"], n["code"] + n["bench"], n["tests"], n["tests"] / (n["code"] + n["bench"])
	}' <<<"$counts"
