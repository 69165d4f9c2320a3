#!/usr/bin/env bash
# Build heapcast/pipeline:bookworm, the image every service of docker/compose.yaml runs:
# the base image first (docker/base/build-base.sh, from Debian's packages), then the pipeline
# image on top of it. The host's extra CA certificates (an egress proxy's) are trusted during
# the build so pip reaches PyPI the way the host does.
#
#   docker/pipeline/build.sh [IMAGE]     default IMAGE: heapcast/pipeline:bookworm
#   PIP_INDEX_URL=...                    another package index for the build
set -euo pipefail
PROJECT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
IMAGE=${1:-heapcast/pipeline:bookworm}
say() { echo "pipeline/build.sh: $*" >&2; }

"$PROJECT_DIR/docker/base/build-base.sh"

CA_DIR="$PROJECT_DIR/docker/pipeline/extra-ca"
find "$CA_DIR" -name '*.crt' -delete
for crt in /usr/local/share/ca-certificates/*.crt; do
    [ -f "$crt" ] && cp "$crt" "$CA_DIR/"
done

say "building $IMAGE"
docker build -f "$PROJECT_DIR/docker/pipeline/Dockerfile" \
    --build-arg "PIP_INDEX_URL=${PIP_INDEX_URL:-https://pypi.org/simple}" \
    -t "$IMAGE" "$PROJECT_DIR"
say "built $IMAGE ($(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.1f GB", $1/1e9}'))"
