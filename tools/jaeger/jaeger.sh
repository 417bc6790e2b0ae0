#!/usr/bin/env bash
# jaeger.sh — a local Jaeger v2 for kumi's traces, on loopback only.
#
#   tools/jaeger/jaeger.sh build    build the binary once (cached)
#   tools/jaeger/jaeger.sh start    build if needed, start, wait until ready,
#                                   print the environment to use it
#   tools/jaeger/jaeger.sh stop     stop the Jaeger this script started
#   tools/jaeger/jaeger.sh status   running or not, and where
#   tools/jaeger/jaeger.sh env      print the environment (eval-able)
#
# Jaeger v2 builds from the Go module proxy (no Docker needed). Its go.mod
# has a replace directive, so `go install …@version` refuses it; the script
# builds inside the downloaded module instead. A cold build takes about ten
# minutes on two cores and runs at nice 19; the binary is cached in
# $KUMI_JAEGER_CACHE (default ~/.cache/kumi/jaeger) and reused. It has no UI
# assets, but the query HTTP API (/api/services, /api/traces) works.
#
# Storage is in memory; everything listens on 127.0.0.1. Ports (defaults):
# KUMI_JAEGER_OTLP_HTTP_PORT 4318, KUMI_JAEGER_OTLP_GRPC_PORT 4317,
# KUMI_JAEGER_QUERY_PORT 16686, KUMI_JAEGER_QUERY_GRPC_PORT 16685,
# KUMI_JAEGER_HEALTH_PORT 13133. Pid file and log: $KUMI_JAEGER_STATE
# (default ${TMPDIR:-/tmp}/kumi-jaeger).
set -euo pipefail

VERSION="${KUMI_JAEGER_VERSION:-v1.76.0}"
MODULE="github.com/jaegertracing/jaeger"
CACHE="${KUMI_JAEGER_CACHE:-$HOME/.cache/kumi/jaeger}"
BIN="$CACHE/jaeger-$VERSION"
STATE="${KUMI_JAEGER_STATE:-${TMPDIR:-/tmp}/kumi-jaeger}"
PIDFILE="$STATE/jaeger.pid"
LOG="$STATE/jaeger.log"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CONFIG="${KUMI_JAEGER_CONFIG:-$HERE/config.yaml}"
GO="${GO:-go}"

export KUMI_JAEGER_OTLP_HTTP_PORT="${KUMI_JAEGER_OTLP_HTTP_PORT:-4318}"
export KUMI_JAEGER_OTLP_GRPC_PORT="${KUMI_JAEGER_OTLP_GRPC_PORT:-4317}"
export KUMI_JAEGER_QUERY_PORT="${KUMI_JAEGER_QUERY_PORT:-16686}"
export KUMI_JAEGER_QUERY_GRPC_PORT="${KUMI_JAEGER_QUERY_GRPC_PORT:-16685}"
export KUMI_JAEGER_HEALTH_PORT="${KUMI_JAEGER_HEALTH_PORT:-13133}"

QUERY_URL="http://127.0.0.1:$KUMI_JAEGER_QUERY_PORT"
OTLP_URL="http://127.0.0.1:$KUMI_JAEGER_OTLP_HTTP_PORT"

log() { echo "jaeger.sh: $*" >&2; }

build() {
	if [[ -x "$BIN" ]]; then
		return 0
	fi
	mkdir -p "$CACHE"
	log "building Jaeger $VERSION from the Go module proxy into $BIN (about ten minutes when cold)"
	local dir
	# Run outside any module so no go.mod or go.sum is touched.
	dir="$(cd "$CACHE" && GOWORK=off GOFLAGS= "$GO" mod download -json "$MODULE@$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
	if [[ -z "$dir" || ! -d "$dir" ]]; then
		log "could not download $MODULE@$VERSION"
		return 1
	fi
	# Build inside the module so its go.mod (and replace directive) applies;
	# the module cache is read-only, which go build does not mind.
	(cd "$dir" && GOWORK=off GOFLAGS=-buildvcs=false nice -n 19 "$GO" build -trimpath \
		-ldflags "-X $MODULE/internal/version.latestVersion=$VERSION" \
		-o "$BIN.tmp" ./cmd/jaeger)
	mv "$BIN.tmp" "$BIN"
	log "built $BIN"
}

running() {
	[[ -f "$PIDFILE" ]] || return 1
	local pid
	pid="$(cat "$PIDFILE")"
	[[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null
}

ready() {
	curl -fsS -o /dev/null --max-time 2 "$QUERY_URL/api/services" 2>/dev/null
}

print_env() {
	cat <<EOF
export OTEL_EXPORTER_OTLP_ENDPOINT=$OTLP_URL
export OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf
export KUMI_JAEGER_URL=$QUERY_URL
EOF
}

start() {
	build
	mkdir -p "$STATE"
	if running; then
		log "already running (pid $(cat "$PIDFILE")), query API $QUERY_URL"
		print_env
		return 0
	fi
	if ready; then
		log "something already answers on $QUERY_URL; not starting another Jaeger"
		print_env
		return 0
	fi
	log "starting $BIN (log $LOG)"
	# setsid: a terminal's Ctrl-C or the caller's exit does not kill it; stop does.
	setsid "$BIN" --config "file:$CONFIG" >"$LOG" 2>&1 </dev/null &
	echo $! >"$PIDFILE"
	local i
	for i in $(seq 1 120); do
		if ready; then
			log "ready: OTLP/HTTP $OTLP_URL, OTLP/gRPC 127.0.0.1:$KUMI_JAEGER_OTLP_GRPC_PORT, query API $QUERY_URL (pid $(cat "$PIDFILE"))"
			print_env
			return 0
		fi
		if ! running; then
			log "Jaeger exited; last lines of $LOG:"
			tail -n 20 "$LOG" >&2 || true
			rm -f "$PIDFILE"
			return 1
		fi
		sleep 0.5
	done
	log "Jaeger did not become ready in 60 s; see $LOG"
	return 1
}

stop() {
	if ! running; then
		rm -f "$PIDFILE"
		log "not running"
		return 0
	fi
	local pid i
	pid="$(cat "$PIDFILE")"
	kill -TERM "$pid"
	for i in $(seq 1 40); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.25
	done
	if kill -0 "$pid" 2>/dev/null; then
		log "pid $pid ignored SIGTERM for 10 s; sending SIGKILL"
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f "$PIDFILE"
	log "stopped (pid $pid)"
}

status() {
	if running; then
		echo "running: pid $(cat "$PIDFILE"), query API $QUERY_URL, OTLP/HTTP $OTLP_URL, log $LOG"
	else
		echo "not running (binary: $([[ -x "$BIN" ]] && echo "$BIN" || echo "not built"))"
		return 1
	fi
}

case "${1:-start}" in
build) build ;;
start) start ;;
stop) stop ;;
restart) stop && start ;;
status) status ;;
env) print_env ;;
bin) build && echo "$BIN" ;;
*)
	echo "usage: $0 {build|start|stop|restart|status|env|bin}" >&2
	exit 2
	;;
esac
