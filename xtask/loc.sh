#!/bin/sh
# Lines of Rust and public items per workspace member, and the Markdown
# under docs/, at one or more revisions (issue 42's closing figures):
#
#   xtask/loc.sh [REV ...]        (default: HEAD)
#
# Read from git (`git archive` into a temporary directory), so any
# revision is counted without a checkout of it and the work tree is not
# touched. Columns, per member:
# - src: lines of the .rs files under src/; "unit tests": of those, the
#   lines from a top-level `#[cfg(test)]` followed by `mod` to the end of
#   its file (where this repository keeps its unit tests), and the whole
#   files that a `#[cfg(test)] mod name;` declares;
# - tests: lines of the .rs files under tests/, benches/ and examples/;
# - pub items: lines of src/ starting with `pub` and then `fn`, `struct`,
#   `enum`, `trait`, `type`, `const`, `static`, `mod`, `use` or `macro`
#   (`async`/`const`/`unsafe` fns too). An approximation of the public
#   API: a `pub` item of a private module counts, `pub(crate)` does not,
#   and a `pub use` of a list counts once.
# Then the lines and words of docs/**/*.md and of every .md file.
set -eu

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The files of `rev` under the given paths whose names end in `ext`,
# extracted under $tmp/$rev; prints their paths (none: nothing).
files() {
    rev=$1; ext=$2; shift 2
    listed=$(git ls-tree -r --name-only "$rev" -- "$@" | grep "\\$ext\$" || true)
    [ -n "$listed" ] || return 0
    mkdir -p "$tmp/$rev"
    # shellcheck disable=SC2086 # a list of paths without spaces
    git archive --format=tar "$rev" -- $listed | tar -x -C "$tmp/$rev"
    for f in $listed; do echo "$tmp/$rev/$f"; done
}

lines() { xargs -r cat | wc -l; }

# The files that a `#[cfg(test)]` `mod name;` declares (whole test files).
test_files() {
    xargs -r awk '
        FNR == 1 { pending = 0 }
        pending && match($0, /^(pub(\([a-z]+\))? )?mod [a-z_0-9]+;/) {
            name = $0; sub(/^(pub(\([a-z]+\))? )?mod /, "", name); sub(/;.*/, "", name)
            dir = FILENAME; sub(/\/[^\/]*$/, "", dir)
            base = FILENAME; sub(/^.*\//, "", base)
            if (base != "mod.rs" && base != "lib.rs" && base != "main.rs") {
                sub(/\.rs$/, "", base); dir = dir "/" base
            }
            print dir "/" name ".rs"
        }
        { pending = /^#\[cfg\(test\)\]/ }'
}

unit_test_lines() {
    list=$(cat)
    whole=$(echo "$list" | test_files)
    in_files=$(echo "$list" | grep -vxF "$whole" | in_file_tests)
    [ -n "$whole" ] && whole_lines=$(echo "$whole" | xargs -r cat 2>/dev/null | wc -l) || whole_lines=0
    echo $((in_files + whole_lines))
}

# Lines from a top-level `#[cfg(test)]` over an inline `mod` to the end of
# its file.
in_file_tests() {
    xargs -r awk '
        FNR == 1 { inside = 0; pending = 0 }
        # The `#[cfg(test)]` line, once the inline `mod name {` under it is seen.
        pending && /^(pub(\([a-z]+\))? )?mod [a-z_0-9]+ *\{/ { inside = 1; n++ }
        { pending = 0 }
        /^#\[cfg\(test\)\]/ && !inside { pending = 1 }
        inside { n++ }
        END { print n + 0 }'
}

pub_items() {
    xargs -r cat |
        grep -cE '^[[:space:]]*pub (async |const |unsafe )*(fn|struct|enum|trait|type|const|static|mod|use|macro) ' || true
}

[ $# -gt 0 ] || set -- HEAD
for rev in "$@"; do
    echo "## $rev ($(git log -1 --format='%h %ad' --date=short "$rev"))"
    echo
    echo "| member | src | of which unit tests | tests, benches, examples | pub items |"
    echo "|---|---:|---:|---:|---:|"
    members=$(git ls-tree -d --name-only "$rev" -- crates/ examples/ | sort
              for d in xtask bench crash; do git ls-tree -d --name-only "$rev" -- "$d"; done)
    ts=0; tu=0; tt=0; tp=0
    for m in $members; do
        src=$(files "$rev" .rs "$m/src")
        s=$(echo "$src" | grep . | lines || echo 0)
        u=$(echo "$src" | grep . | unit_test_lines || echo 0)
        p=$(echo "$src" | grep . | pub_items || echo 0)
        t=$(files "$rev" .rs "$m/tests" "$m/benches" "$m/examples" | lines || echo 0)
        ts=$((ts + s)); tu=$((tu + u)); tt=$((tt + t)); tp=$((tp + p))
        echo "| $m | $s | $u | $t | $p |"
    done
    echo "| **all** | $ts | $tu | $tt | $tp |"
    echo
    echo "docs/**/*.md (lines, words): $(files "$rev" .md docs | xargs -r cat | wc -lw | awk '{print $1, $2}')"
    echo
    echo "every .md file (lines, words): $(files "$rev" .md . | xargs -r cat | wc -lw | awk '{print $1, $2}')"
    echo
done
