#!/usr/bin/env bash
# Instructions per request by where their code lives (crate, idemgate's own src/, libc),
# from a callgrind dump that instructions.sh kept:
#
#   KEEP=/tmp/cg ROWS="bg cg c" bash benches/load/instructions.sh
#   bash benches/load/by-crate.sh /tmp/cg/callgrind.cg [N]     # N: counted requests, 3000
#
# Code inlined from the standard library (moves, iterators, Option/Result plumbing) is
# counted for the crate whose function inlined it ("hyper (std inlined)"), or as
# std/core where the function is generic over another crate's types (`<Pin<P> as
# Future>::poll`): the crates' shares are lower bounds. Warm-up requests are not in the
# dump (counting was off).
set -euo pipefail
dump=${1:?usage: by-crate.sh CALLGRIND_DUMP [N]}
n=${2:-3000}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
callgrind_annotate --auto=no --inclusive=no --threshold=100 "$dump" | awk -v n="$n" -v root="$root" '
    /file:function/ { listing = 1; next }
    listing && /^ *[0-9,]+ / {
        count = $1; gsub(",", "", count)
        # The file the code is in: what follows the "(share%)" column, up to its colon
        # (callgrind_annotate shortens paths under the current directory).
        file = $0; sub(/^ *[0-9,]+ +\([ 0-9.]+%\) +/, "", file); sub(/:.*/, "", file)
        where = "other"
        if (file ~ ("^(" root "/)?src/")) where = "idemgate (src/)"
        else if (match(file, /index\.crates\.io-[0-9a-f]+\/([A-Za-z_0-9-]+)-[0-9]/, m)) where = m[1]
        else if (file ~ /^\/rustc\//) {
            # Code of the standard library inlined into a function: counted for the crate
            # that function is in (the first segment of its path), where the name says it.
            fn = $0; sub(/^[^:]*:/, "", fn); sub(/^</, "", fn); sub(/::.*/, "", fn)
            where = (fn ~ /^(core|alloc|std)$/ || fn == "") ? "std/core" : (fn == "idemgate" ? "idemgate (src/)" : fn " (std inlined)")
        }
        else if ($0 ~ /libc\.so/) where = "libc"
        by[where] += count; total += count
    }
    END {
        printf "| code | instructions / request | share |\n|---|---:|---:|\n"
        for (w in by) printf "| %s | %.0f | %.1f%% |\n", w, by[w] / n, 100 * by[w] / total | "sort -t\"|\" -k3 -rn"
        close("sort -t\"|\" -k3 -rn")
        printf "| all | %.0f | |\n", total / n
    }'
