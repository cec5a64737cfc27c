#!/usr/bin/env bash
# debian_uri (scripts/install_deps.sh), which finds the machine's Debian mirror in its apt sources,
# on sample files: one-line entries with and without an options block, deb822 stanzas with one or
# several suites, comments, disabled stanzas and other suites, which must be passed over.
#   tests/scripts/debian_uri_test.sh [path/to/install_deps.sh]
# (ctest: unit.scripts.debian_uri). Exits non-zero, naming each failed check, if any fails.
set -uo pipefail
script=${1:-$(cd "$(dirname "$0")/../.." && pwd)/scripts/install_deps.sh}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# Sourcing must define the functions and do nothing else (no install, no output).
# shellcheck source=/dev/null
sourced=$(source "$script" 2>&1; type -t debian_uri)
failures=0
check() {   # check NAME EXPECTED ACTUAL
  if [ "$2" = "$3" ]; then echo "ok: $1"; else echo "FAILED: $1: expected '$2', got '$3'"; failures=$((failures + 1)); fi
}
check "sourcing only defines debian_uri" "function" "$sourced"
# shellcheck source=/dev/null
source "$script"

cat >"$dir/plain.list" <<'S'
deb http://plain.invalid/debian bookworm main
S
cat >"$dir/options.list" <<'S'
deb [signed-by=/usr/share/keyrings/x.gpg arch=amd64] http://options.invalid/debian bookworm main contrib
S
cat >"$dir/options_spaced.list" <<'S'
deb [ arch=amd64 signed-by=/usr/share/keyrings/x.gpg ] http://spaced.invalid/debian/ bookworm main
S
cat >"$dir/commented.list" <<'S'
# deb http://commented.invalid/debian bookworm main
#deb [arch=amd64] http://commented2.invalid/debian bookworm main
    # deb http://indented-comment.invalid/debian bookworm main
deb http://security.invalid/debian-security bookworm-security main
deb [arch=amd64] http://updates.invalid/debian bookworm-updates main
deb http://trixie.invalid/debian trixie main
  deb [arch=amd64] http://real.invalid/debian bookworm main   # the one
S
cat >"$dir/none.list" <<'S'
# deb http://commented.invalid/debian bookworm main
deb http://backports.invalid/debian bookworm-backports main
S
cat >"$dir/deb822.sources" <<'S'
Types: deb
URIs: http://deb822.invalid/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
S
cat >"$dir/several.sources" <<'S'
Types: deb
URIs: http://security.invalid/debian-security
Suites: bookworm-security
Components: main

Types: deb
URIs: http://disabled.invalid/debian
Suites: bookworm
Components: main
Enabled: no

#Types: deb
#URIs: http://commented.invalid/debian
#Suites: bookworm
#Components: main

Types: deb
# URIs: http://commented-in-stanza.invalid/debian
URIs: http://several.invalid/debian http://second.invalid/debian
Suites: bookworm-updates bookworm
Components: main
S
cat >"$dir/folded.sources" <<'S'
types: deb deb-src
uris: http://folded.invalid/debian
suites: bookworm-updates
 bookworm
components: main
S
cat >"$dir/none.sources" <<'S'
Types: deb
URIs: http://updates.invalid/debian
Suites: bookworm-updates bookworm-backports
Components: main
S

check "one-line, plain" "http://plain.invalid/debian" "$(debian_uri "$dir/plain.list")"
check "one-line, [options]" "http://options.invalid/debian" "$(debian_uri "$dir/options.list")"
check "one-line, [ options ] with blanks" "http://spaced.invalid/debian/" "$(debian_uri "$dir/options_spaced.list")"
check "one-line, comments and other suites skipped" "http://real.invalid/debian" "$(debian_uri "$dir/commented.list")"
check "one-line, no bookworm entry" "" "$(debian_uri "$dir/none.list")"
check "deb822" "http://deb822.invalid/debian" "$(debian_uri "$dir/deb822.sources")"
check "deb822, several suites, comments, disabled stanza" "http://several.invalid/debian" "$(debian_uri "$dir/several.sources")"
check "deb822, lower-case fields, folded Suites" "http://folded.invalid/debian" "$(debian_uri "$dir/folded.sources")"
check "deb822, no bookworm stanza" "" "$(debian_uri "$dir/none.sources")"
check "first file with an entry wins" "http://options.invalid/debian" \
  "$(debian_uri "$dir/none.sources" "$dir/none.list" "$dir/missing.list" "$dir/options.list" "$dir/plain.list")"

if [ "$failures" -gt 0 ]; then echo "$failures check(s) failed"; exit 1; fi
echo "all checks passed"
