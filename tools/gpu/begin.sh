# Sourced first by the GPU machine's check scripts: `source "$(dirname "$0")/begin.sh" BUNDLE REPORT`
# unpacks BUNDLE into $bundle (/tmp/specula-gpu), makes the report folder $report, sources env.sh
# (the loader path and the step helper) and starts the clock `step` reports against.
set -uo pipefail
report=$2
mkdir -p "$report"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
"$here/unpack.sh" "$1"
bundle=/tmp/specula-gpu
source "$here/env.sh"
start=$SECONDS
