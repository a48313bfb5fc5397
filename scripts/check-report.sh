#!/usr/bin/env bash
# Renders a `shoal report` page in headless Chromium and checks that every plot rendered:
# the page's own load script counts plots and broken images/SVGs into <body data-*>.
# Also saves a screenshot next to the page. Usage: scripts/check-report.sh [results-dir]
# Installs Debian's chromium if it is missing (needs apt access).
set -euo pipefail
dir="${1:-results}"
page="$(cd "$dir" && pwd)/index.html"
[ -f "$page" ] || { echo "no $page: run 'cargo run --release -- report $dir' first" >&2; exit 1; }
if ! command -v chromium >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
flags=(--headless --no-sandbox --disable-gpu --virtual-time-budget=10000)
dom="$(chromium "${flags[@]}" --dump-dom "file://$page" 2>/dev/null)"
plots="$(grep -o 'data-plots="[^"]*"' <<<"$dom" | head -1 | cut -d'"' -f2)"
broken="$(grep -o 'data-broken="[^"]*"' <<<"$dom" | head -1 | cut -d'"' -f2)"
svgs="$(find "$dir" -maxdepth 1 -name '*.svg' | wc -l)"
chromium "${flags[@]}" --window-size=1200,3000 --screenshot="$dir/report.png" "file://$page" >/dev/null 2>&1 || true
echo "plots rendered: $plots of $svgs svg files; broken: $broken; screenshot: $dir/report.png"
[ "$plots" = "$svgs" ] && [ "$broken" = "0" ]
