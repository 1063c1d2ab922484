#!/usr/bin/env bash
# One script for the GPU machine.
#
#   scripts/gpu.sh build            on any machine with Go (no GPU needed):
#                                   builds the test binaries and the CLI into
#                                   build/gpu/ (static, CGO_ENABLED=0).
#   scripts/gpu.sh run [PART...]    on the GPU machine (no Go needed), from
#                                   the repository root: runs the PARTs and
#                                   writes everything under $OUT (default
#                                   build/gpu/out). PARTs: tests, cost,
#                                   cpubench, replay, peers, table (the
#                                   default: all six), passes (the peak
#                                   over PASSES=10 passes in a row, gpumem
#                                   and PyTorch's allocators), python (the
#                                   Python package's tests, PyTorch and
#                                   CuPy on gpumem), wheel (the wheel
#                                   in a fresh venv: a PyTorch and a JAX
#                                   program from it), torchtests
#                                   (PyTorch's test_cuda.py under each
#                                   allocator: bench/torchtests), trees
#                                   (PyTorch's test_cudagraph_trees.py, the
#                                   same way), jaxcheck (XLA's command
#                                   buffers' data on gpumem), train (real
#                                   training under each allocator:
#                                   bench/train; PROGRAMS=a,b for some)
#                                   record (those programs' traces and
#                                   real pool peaks under gpumem, for
#                                   bench/train/replay_check.py) and
#                                   pressure (each program unlimited and
#                                   under a limit of its fit capacity),
#                                   tight (issue 30: each program of
#                                   FITS on the GPU, unlimited and under
#                                   Gather at its ten-pass fit, driver
#                                   calls timed) and
#                                   pathcost (an allocation's cost on the
#                                   driver and inside PyTorch), ranks
#                                   (FSDP2 on every GPU, each rank's pool
#                                   in gpumem top and one gpumem serve),
#                                   fsdp (FSDP2 on every GPU under each
#                                   allocator, ROUNDS interleaved),
#                                   histories (PyTorch's expandable
#                                   segments' real placements, as the
#                                   emulation's test data:
#                                   HISTORY_PROGRAMS=a,b), compactsteps
#                                   (the default against compact=true,
#                                   span_size=16MiB, step by step),
#                                   vmmjob (a span's driver calls timed
#                                   on every GPU while an FSDP2 job runs,
#                                   and without one).
#
# The GPU machine of this project has no Go and no network: build here, carry
# build/gpu, run there. Results land in at most 8 files (the device tool's
# limit): tests.log (headed by the machine and the commit), cost.txt,
# cpubench.txt, replay_sim.jsonl, replay_cuda.jsonl, peers.jsonl, peers.log,
# table.md.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/gpu

build() {
	mkdir -p "$bin"
	export CGO_ENABLED=0
	# Stripped (-s -w): what the device tool carries shares 64 MiB with the
	# tree (about 40 MiB of traces and results); carry the parts a run needs.
	local ld=(-ldflags="-s -w")
	go test -c "${ld[@]}" -o "$bin/cuda.test" ./device/cuda
	go test -c "${ld[@]}" -o "$bin/nvml.test" ./nvml
	go test -c "${ld[@]}" -o "$bin/gputest.test" ./internal/gputest
	go test -c "${ld[@]}" -o "$bin/gpumem_pkg.test" .
	go build "${ld[@]}" -o "$bin/gpumem" ./cmd/gpumem
	scripts/lib.sh # build/libgpumem.so and its copy in python/gpumem/ (cgo)
	# The C caller's pair (clib/cbench), for the pathcost part; it finds
	# the library beside it at run time.
	cc -O2 -I clib -o "$bin/pairs" clib/cbench/pairs.c -L build -lgpumem -Wl,-rpath,'$ORIGIN/../../python/gpumem'
	cc -O2 -I clib -o "$bin/gaps" clib/cbench/gaps.c -L build -lgpumem -Wl,-rpath,'$ORIGIN/../../python/gpumem'
	rm -f "$bin"/gpumem-*.whl
	scripts/wheel.sh "$bin" # the wheel (libgpumem.so, the shim, the command) for the wheel part
	git describe --always --dirty >"$bin/COMMIT" 2>/dev/null || true
	ls -l "$bin"
}

run() {
	local out=${OUT:-$bin/out}
	mkdir -p "$out"
	local parts=("$@")
	[ ${#parts[@]} -eq 0 ] && parts=(tests cost cpubench replay peers table)
	export GPUMEM_REQUIRE_GPU=1
	# The library the Python parts load: the checkout's if built there,
	# else the one the wheel part installed (so only the wheel need be
	# carried).
	use_wheel_library() {
		[ -n "${GPUMEM_LIBRARY:-}" ] || [ -f python/gpumem/libgpumem.so ] && return
		local lib
		lib=$(ls "${TMPDIR:-/tmp}"/gpumem-wheel-venv/lib/python*/site-packages/gpumem/libgpumem.so 2>/dev/null | head -1)
		[ -n "$lib" ] && export GPUMEM_LIBRARY=$lib
		return 0
	}
	# Times are medians of this many runs (gpumem and the C++ peers): one
	# pass on this machine varies by tens of percent.
	local repeat=${REPEAT:-5}
	machine() {
		date -u
		nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
		cat "$bin/COMMIT" 2>/dev/null || true
	}
	for part in "${parts[@]}"; do
		echo "== $part" >&2
		case $part in
		tests)
			{
				machine
				"$bin/cuda.test" -test.v -test.count=1 2>&1 | grep -vE '^=== (RUN|PAUSE|CONT)' || true
				"$bin/nvml.test" -test.v -test.count=1 2>&1 | grep -vE '^=== (RUN|PAUSE|CONT)' || true
				"$bin/gputest.test" -test.v -test.count=1 -test.timeout 300s 2>&1 | grep -vE '^=== (RUN|PAUSE|CONT)' || true
			} >"$out/tests.log" 2>&1
			grep -cE '^\s*--- FAIL' "$out/tests.log" | sed 's/^/failures: /' >&2 || true
			;;
		cost)
			{
				"$bin/cuda.test" -test.run XXX -test.bench DriverCost -test.benchtime 20x
				GPUMEM_DRIVER_PHASES=1 "$bin/cuda.test" -test.run 'TestDriverPhases|TestDriverParallel' -test.v
			} >"$out/cost.txt" 2>&1 || true
			;;
		cpubench)
			# The allocator's own speed, on this machine's CPUs (16 cores).
			{
				"$bin/gpumem_pkg.test" -test.run XXX -test.bench 'AllocFree' -test.cpu 1,2,4,8,16 -test.count 3
				"$bin/gpumem_pkg.test" -test.run XXX -test.bench 'Replay' -test.cpu 1 -test.benchtime 5x -test.count 3
			} >"$out/cpubench.txt" 2>&1 || true
			;;
		replay)
			"$bin/gpumem" replay --device sim --json --warm --repeat "$repeat" testdata/traces/*.trace.gz >"$out/replay_sim.jsonl" || true
			"$bin/gpumem" replay --device cuda --json --warm --repeat "$repeat" testdata/traces/*.trace.gz >"$out/replay_cuda.jsonl" || true
			;;
		peers)
			OUT="$out" bash bench/peers/run_all.sh --repeat "$repeat" || true
			rm -f "$out/peers_table.md" # table.md holds it, with gpumem
			;;
		passes)
			# Not in the default set (the device tool brings back at most 8
			# files): gpumem and PyTorch's allocators over PASSES (10) passes
			# of each trace in a row, the peak over all of them.
			local n=${PASSES:-10}
			"$bin/gpumem" replay --device cuda --json --passes "$n" testdata/traces/*.trace.gz >"$out/passes.jsonl" || true
			OUT="$out" PEERS=${PEERS:-torch-native,torch-expandable,torch-async,torch-native-cxx,torch-expandable-cxx} \
				bash bench/peers/run_all.sh --no-warm --passes "$n" --out "$out/passes_peers.jsonl" || true
			rm -f "$out/peers_table.md"
			;;
		tight)
			# Issue 30's time bar under a limit: each program of FITS (a
			# file of `gpumem fit --passes 10` lines prefixed with the
			# trace's path; default the Gather fits of
			# bench/results/sim-keep-3704025) replayed on the GPU over ten
			# passes, unlimited and under Config.Gather at its fit figure
			# as a limit, with every driver call timed, ROUNDS times over
			# (default 1) so that the table shows the noise
			# (bench/core/calls_at_fit.sh). The table:
			# bench/core/tight_table.py tight.jsonl.
			DEVICE=cuda GPUMEM="$bin/gpumem" bash bench/core/calls_at_fit.sh \
				"${FITS:-bench/results/sim-keep-3704025/fit10-gather.txt}" >>"$out/tight.jsonl" 2>>"$out/tight.log"
			tail -5 "$out/tight.log" >&2
			;;
		python)
			use_wheel_library
			{
				machine
				echo "library: ${GPUMEM_LIBRARY:-python/gpumem/libgpumem.so}"
				python3 -m pytest -v -rs python/tests 2>&1
			} >"$out/python.log" 2>&1 || true
			tail -1 "$out/python.log" >&2
			;;
		wheel)
			# The wheel alone, as a user without Go installs it: a fresh
			# venv (system site packages: PyTorch, JAX), pip with no index,
			# then a PyTorch program under gpumem.torch.use() and a JAX
			# program under gpumem run, both run from outside the checkout.
			{
				machine
				local venv=${TMPDIR:-/tmp}/gpumem-wheel-venv here=$PWD
				rm -rf "$venv"
				python3 -m venv --system-site-packages "$venv"
				# PyTorch and JAX where the machine's python3 finds them but
				# a venv would not (a user site or PYTHONPATH): named in a
				# .pth file of the venv, said here.
				local m dir site
				site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
				for m in torch jax; do
					"$venv/bin/python" -c "import $m" 2>/dev/null && continue
					dir=$(python3 -c "import $m, os; print(os.path.dirname(os.path.dirname($m.__file__)))" 2>/dev/null) || continue
					echo "$dir" >>"$site/machine-packages.pth"
					echo "venv: $m from $dir (not a system site package of python3)"
				done
				"$venv/bin/pip" install --no-index --no-deps "$bin"/gpumem-*.whl
				(cd "$venv" && "$venv/bin/gpumem" --help | head -3 && "$venv/bin/python" -m gpumem version)
				(cd "$venv" && "$venv/bin/python" "$here/bench/wheel/torch_train.py") || echo "FAIL: torch_train.py"
				(cd "$venv" && "$venv/bin/gpumem" run -- "$venv/bin/python" "$here/bench/wheel/jax_train.py") || echo "FAIL: jax_train.py"
			} >"$out/wheel.log" 2>&1 || true
			grep -E '^(ok|FAIL)' "$out/wheel.log" >&2 || true
			;;
		torchtests)
			use_wheel_library
			OUT="$out/torchtests" bash bench/torchtests/run.sh ${SELECTION:-} >"$out/torchtests.log" 2>&1 || true
			tail -30 "$out/torchtests.log" >&2
			# One file back (the device tool brings back at most 8).
			tar czf "$out/torchtests.tgz" -C "$out" torchtests && rm -rf "$out/torchtests"
			;;
		jaxcheck)
			# XLA's command buffers on gpumem: bench/jax/cmdbuf_check.py
			# under XLA's allocator, then under gpumem run with XLA's
			# default command buffers (captures of cuBLAS calls). Carry
			# build/gpu/gpumem, build/libgpumem.so and
			# build/libgpumem_preload.so.
			# Or, after the wheel part, the wheel's command (it finds its
			# own library and shim).
			{
				machine
				echo "== XLA's allocator"
				XLA_PYTHON_CLIENT_PREALLOCATE=false python3 bench/jax/cmdbuf_check.py || echo "FAIL (XLA's allocator)"
				echo "== gpumem run --xla-command-buffers xla"
				local venv=${TMPDIR:-/tmp}/gpumem-wheel-venv
				if [ -x "$venv/bin/gpumem" ]; then
					"$venv/bin/gpumem" run --xla-command-buffers xla -- python3 bench/jax/cmdbuf_check.py || echo "FAIL (gpumem)"
				else
					GPUMEM_LIBRARY=build/libgpumem.so GPUMEM_PRELOAD=build/libgpumem_preload.so \
						"$bin/gpumem" run --xla-command-buffers xla -- python3 bench/jax/cmdbuf_check.py || echo "FAIL (gpumem)"
				fi
			} >"$out/jaxcheck.log" 2>&1 || true
			tail -6 "$out/jaxcheck.log" >&2
			;;
		trees)
			# PyTorch's CUDA graph tree tests (torch.compile's
			# reduce-overhead) under each allocator: about 2 minutes under
			# PyTorch's, 6 under gpumem on the H100 (docs/BENCHMARKS.md).
			use_wheel_library
			OUT="$out/trees" TEST_FILE=build/third_party/test_cudagraph_trees.py \
				bash bench/torchtests/run.sh all >"$out/trees.log" 2>&1 || true
			tail -30 "$out/trees.log" >&2
			tar czf "$out/trees.tgz" -C "$out" trees && rm -rf "$out/trees"
			;;
		train)
			use_wheel_library
			local progs=()
			[ -n "${PROGRAMS:-}" ] && progs=(--programs "$PROGRAMS")
			python3 bench/train/suite.py "${progs[@]}" --out "$out/train.jsonl" >"$out/train.md" 2>"$out/train.log" || true
			cat "$out/train.md" >&2
			;;
		record)
			# Issue 30's replay-versus-run check: each bench/train program
			# (PROGRAMS=a,b for some) run as the training suite runs it
			# (run.py: a synchronize at every step's loss, both rounds),
			# recorded whole (--record), its trace and its final stats
			# (the real pool peak) packed in record.tgz;
			# bench/train/replay_check.py replays them anywhere. (A run
			# that does not synchronize, record_check.py's, lets the host
			# run steps ahead of the GPU, which no trace holds.)
			use_wheel_library
			local dir=$out/record prog
			mkdir -p "$dir"
			local all
			all=$(cd bench/train && python3 -c 'import programs; print(",".join(programs.PROGRAMS))')
			for prog in $(echo "${PROGRAMS:-$all}" | tr , ' '); do
				python3 bench/train/run.py "$prog" gpumem --record "$dir/$prog.gpumem.trace.gz" --tag record \
					--out "$dir/$prog.run.jsonl" >>"$out/record.log" 2>&1 || { echo "FAIL: $prog" | tee -a "$out/record.log" >&2; continue; }
				python3 -c '
import json, sys
rec = json.loads(open(sys.argv[1]).read().splitlines()[-1])
st = rec["gpumem_stats"]
json.dump({"peak_reserved": st["PeakReserved"], "allocator": st}, open(sys.argv[2], "w"))' \
					"$dir/$prog.run.jsonl" "$dir/$prog.gpumem.stats.json"
			done
			tar czf "$out/record.tgz" -C "$out" record && rm -rf "$dir"
			;;
		pressure)
			# Issue 30's runs under a limit: each bench/train program
			# (PROGRAMS=a,b for some) run under gpumem with its whole run
			# recorded (run.py --record: both of its rounds, which the
			# limit must hold), the trace fitted (gpumem fit --policy
			# gpumem, its figure rounded up), then run unlimited and
			# under a limit of each FACTORS (default 1) times that
			# capacity, ROUNDS times (default 2), interleaved, so that
			# the step times come from the same machine start and show
			# their noise. Tags: "unlimited", "limit=L" for the factor 1
			# (bench/train/pressure_table.py) and "limit=L xF" for the
			# others (bench/train/steps_table.py reads them all).
			# FIT_POLICY=gpumem-gather fits under Config.Gather and runs
			# at that figure with gather=true
			# (GPUMEM_CONFIG=limit=L,gather=true).
			use_wheel_library
			local dir=$out/pressure prog cap pol=${FIT_POLICY:-gpumem} extra=
			[ "$pol" = gpumem-gather ] && extra=,gather=true
			mkdir -p "$dir"
			local all
			all=$(cd bench/train && python3 -c 'import programs; print(",".join(programs.PROGRAMS))')
			for prog in $(echo "${PROGRAMS:-$all}" | tr , ' '); do
				if ! python3 bench/train/run.py "$prog" gpumem --record "$dir/$prog.gpumem.trace.gz" --tag record \
					--out "$out/pressure.jsonl" >>"$out/pressure.log" 2>&1; then
					echo "FAIL: recording $prog" | tee -a "$out/pressure.log" >&2
					continue
				fi
				"$bin/gpumem" fit --policy "$pol" "$dir/$prog.gpumem.trace.gz" >"$dir/$prog.fit.txt" 2>&1 || true
				cap=$(awk -v pol="$pol" '$1 == pol { print $2 $3; exit }' "$dir/$prog.fit.txt")
				echo "$prog: fit $cap" | tee -a "$out/pressure.log" >&2
				[ -n "$cap" ] || continue
				local tags=(unlimited) f lim
				for f in ${FACTORS:-1}; do
					if [ "$f" = 1 ]; then
						tags+=("limit=$cap$extra")
					else
						# The figure times f, rounded up to 0.01 of its unit.
						lim=$(awk -v pol="$pol" -v f="$f" '$1 == pol { v = $2 * f; r = int(v * 100); if (r < v * 100) r++; printf "%.2f%s", r / 100, $3; exit }' "$dir/$prog.fit.txt")
						tags+=("limit=$lim$extra x$f")
					fi
				done
				local round tag
				for round in $(seq "${ROUNDS:-2}"); do
					for tag in "${tags[@]}"; do
						# A failed run leaves an "error" line, as suite.py's
						# do (bench/train/pressure_table.py counts them).
						local cfg=()
						[[ $tag == limit=* ]] && cfg=("GPUMEM_CONFIG=${tag%% *}")
						if ! env "${cfg[@]}" python3 bench/train/run.py "$prog" gpumem \
							--out "$out/pressure.jsonl" --tag "$tag" >"$dir/run.log" 2>&1; then
							echo "FAIL: $prog $tag" | tee -a "$out/pressure.log" >&2
							python3 -c '
import json, sys
err = open(sys.argv[4]).read()[-2000:]
print(json.dumps({"program": sys.argv[1], "allocator": "gpumem", "tag": sys.argv[2], "error": err}), file=open(sys.argv[3], "a"))' \
								"$prog" "$tag" "$out/pressure.jsonl" "$dir/run.log"
						fi
						cat "$dir/run.log" >>"$out/pressure.log"
					done
				done
				rm -f "$dir/run.log"
			done
			tar czf "$out/pressure.tgz" -C "$out" pressure && rm -rf "$dir"
			;;
		ranks)
			# Issue 42 item 2's observation bar: FSDP2 on every GPU of
			# the machine (torchrun, bench/train/ddp.py --fsdp), each rank
			# serving its pool (GPUMEM_CONFIG=serve=127.0.0.1:0), and while
			# it trains, `gpumem top --once` (every rank's pool beside
			# NVML's figure) and one `gpumem serve` scraped once (every
			# rank's series, labelled by pid): top.txt, metrics.txt,
			# ranks.jsonl.
			use_wheel_library
			local n
			n=$(nvidia-smi -L | wc -l)
			GPUMEM_CONFIG=serve=127.0.0.1:0 python3 -m torch.distributed.run --nproc_per_node "$n" \
				bench/train/ddp.py gpumem --fsdp --steps 60 --out "$out/ranks.jsonl" >"$out/ranks.log" 2>&1 &
			local train=$! i
			"$bin/gpumem" serve --listen 127.0.0.1:9464 >>"$out/ranks.log" 2>&1 &
			local served=$!
			local run_dir=${GPUMEM_RUN_DIR:-${TMPDIR:-/tmp}/gpumem-$(id -u)}
			for i in $(seq 120); do # until every rank announces its pool (internal/announce), at most a minute
				sleep 0.5
				[ "$(ls "$run_dir" 2>/dev/null | grep -c '^[0-9][0-9]*$')" -ge "$n" ] && break
			done
			sleep 25 # into the steps (model building and the first step take about 20 s)
			"$bin/gpumem" top --once >"$out/top.txt" 2>&1 || true
			python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:9464/metrics", timeout=30).read().decode())' \
				>"$out/metrics.txt" 2>&1 || true
			wait "$train" || echo "FAIL: the FSDP run" | tee -a "$out/ranks.log" >&2
			kill "$served" 2>/dev/null || true
			echo "pools in top: $(grep -c '^ *[0-9][0-9]* ' "$out/top.txt"), pids in metrics: $(grep '^gpumem_' "$out/metrics.txt" | grep -o 'pid="[0-9]*"' | sort -u | wc -l) (ranks: $n)" | tee -a "$out/ranks.log" >&2
			;;
		fsdp)
			# Issue 40's four-GPU bar: FSDP2 on every GPU of the machine
			# (torchrun, bench/train/ddp.py --fsdp) under gpumem,
			# expandable segments and native, interleaved ROUNDS times
			# (2), STEPS steps each (30): fsdp.jsonl (every rank's NVML
			# peak, steps, gpumem's counters and host times per step) and
			# fsdp.md (bench/train/ddp_table.py: steady steps, the host
			# time of growth against steady).
			use_wheel_library
			local n r a
			n=$(nvidia-smi -L | wc -l)
			for r in $(seq "${ROUNDS:-2}"); do
				for a in gpumem expandable native; do
					python3 -m torch.distributed.run --nproc_per_node "$n" bench/train/ddp.py "$a" --fsdp \
						--steps "${STEPS:-30}" --tag "r$r" --out "$out/fsdp.jsonl" >>"$out/fsdp.log" 2>&1 ||
						echo "FAIL: $a round $r" | tee -a "$out/fsdp.log" >&2
				done
			done
			python3 bench/train/ddp_table.py "$out/fsdp.jsonl" >"$out/fsdp.md"
			;;
		pathcost)
			# What an allocation costs on the real device: the C caller's
			# pair on the driver (clib/cbench, no PyTorch), alone and
			# after gaps with the caches evicted (gaps.c), then
			# torch.empty+del inside PyTorch under PyTorch's allocator,
			# a near-empty pluggable allocator and gpumem, interleaved,
			# three rounds (bench/torchalloc/alloc_bench.py).
			use_wheel_library
			{
				machine
				echo "== clib/cbench/pairs on the driver"
				"$bin/pairs" || echo "FAIL: pairs"
				echo "== clib/cbench/gaps on the driver (gaps between pairs, caches evicted)"
				"$bin/gaps" || echo "FAIL: gaps"
			} >"$out/pathcost.log" 2>&1
			local round a
			for round in 1 2 3; do
				for a in native pluggable gpumem; do
					python3 bench/torchalloc/alloc_bench.py "$a" --n 10000 --repeat 5 --out "$out/allocbench.jsonl" \
						>/dev/null 2>>"$out/pathcost.log" || echo "FAIL: $a round $round" >>"$out/pathcost.log"
				done
			done
			cat "$out/pathcost.log" >&2
			;;
		histories)
			# The torch-expandable emulation's test data: each program of
			# HISTORY_PROGRAMS (one stream each; four by default) run
			# under PyTorch's expandable segments with its memory
			# history, and its first
			# 40,000 requests written as policy/testdata fixtures
			# (bench/train/history_probe.py run, then fixture):
			# $out/fixtures/NAME_expandable.{trace,offsets}.gz, to copy
			# into policy/testdata, where TestTorchExpandableAgainstRealHistory
			# takes them up. history.jsonl: each run's peaks.
			local p hp=${HISTORY_PROGRAMS:-gpt2_generate,resnet50_train,t5_beam_search,spec_decode}
			mkdir -p "$out/fixtures"
			for p in ${hp//,/ }; do
				PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 bench/train/history_probe.py run "$p" \
					"$out/fixtures/$p.pickle" >>"$out/history.jsonl" 2>>"$out/history.log" &&
					python3 bench/train/history_probe.py fixture "$out/fixtures/$p.pickle" \
						"$out/fixtures/${p}_expandable" >>"$out/history.log" 2>&1 ||
					echo "FAIL: $p" >>"$out/history.log"
				rm -f "$out/fixtures/$p.pickle"
			done
			;;
		compactsteps)
			# Issue 40: is Compact's placement with 16 MiB spans (which
			# meets the unlimited memory bar on 37 of the 40 traces) within
			# the step-time bar? Each program of PROGRAMS (default
			# resnet50_train, whose steps are the shortest) under the
			# default and under compact=true,span_size=16MiB, unlimited,
			# ROUNDS (3) interleaved rounds, per-step times and counters
			# (bench/train/stepprof.py): compactsteps.jsonl.
			use_wheel_library
			local r p c progs=${PROGRAMS:-resnet50_train}
			for r in $(seq "${ROUNDS:-3}"); do
				for p in ${progs//,/ }; do
					for c in "" "compact=true,span_size=16MiB"; do
						GPUMEM_CONFIG=$c python3 bench/train/stepprof.py "$p" gpumem --steps 60 --profile-steps 0 \
							--tag "r$r ${c:-default}" --out "$out/compactsteps.jsonl" >/dev/null 2>>"$out/compactsteps.log" ||
							echo "FAIL: $p $c round $r" >>"$out/compactsteps.log"
					done
				done
			done
			;;
		vmmjob)
			# Where the four-GPU growth steps' driver time comes from
			# (docs/BENCHMARKS.md, "FSDP2 and the ranks on four H200s":
			# 8 ms a span inside FSDP2's ranks, 58-230 us in
			# bench/core/vmm_cost.c alone). vmm_cost runs on every GPU
			# at once, outside the job: before it, 25, 35 and 50 s after
			# the job's start (model building takes about 20 s, step 0's
			# growth 13 s on four H200s, then steady steps), for each of
			# gpumem and expandable segments. Slow only while the job runs: the
			# device is what slows the calls (its kernels, its traffic);
			# slow in the job's ranks alone (STEPS=30 run fsdp prints
			# their driver time by call): their own contexts are; slow
			# with vmm_cost's own kernels in flight (busy) and peer access
			# on: a call waits for the device's work, no NCCL needed.
			# vmm_job.txt.
			local cc_home=${CUDA_HOME:-/usr/local/cuda} n a d when
			[ -f "$cc_home/include/cuda.h" ] || cc_home=$(dirname "$(dirname "$(command -v nvcc)")")
			gcc -O2 -o "$out/vmm_cost" bench/core/vmm_cost.c -I"$cc_home/include" -L"$cc_home/lib64/stubs" -lcuda
			n=$(nvidia-smi -L | wc -l)
			probe() { # $1: a label, then vmm_cost's peer/busy arguments. Waits for its own processes only (not the job).
				echo "== $1"
				local pids=() d
				shift
				for d in $(seq 0 $((n - 1))); do
					"$out/vmm_cost" "$d" 100 32 "$@" >"$out/vmm_$d.txt" 2>&1 &
					pids+=($!)
				done
				wait "${pids[@]}"
				for d in $(seq 0 $((n - 1))); do cat "$out/vmm_$d.txt"; done
			}
			{
				machine
				probe "no job"
				# The job's situation in one process without NCCL: its
				# own kernels in flight, peer access enabled.
				probe "no job; this process's memsets in flight" - busy
				probe "no job; peer access, this process's memsets in flight" peer busy
				use_wheel_library
				for a in gpumem expandable; do
					python3 -m torch.distributed.run --nproc_per_node "$n" bench/train/ddp.py "$a" --fsdp \
						--steps 40 --tag vmmjob --out "$out/vmm_job.jsonl" >"$out/vmm_job_$a.log" 2>&1 &
					local job=$! last=0
					for when in 25 35 50; do
						sleep $((when - last))
						last=$when
						probe "$a job running, about ${when} s after its start"
					done
					wait "$job" || echo "FAIL: the $a job"
				done
				probe "no job, after"
			} >"$out/vmm_job.txt" 2>&1
			rm -f "$out"/vmm_[0-9]*.txt "$out/vmm_cost"
			;;
		table)
			{
				echo "## First pass (cold)"
				python3 bench/peers/table.py "$out/peers.jsonl" "$out/replay_cuda.jsonl"
				echo
				echo "## Second pass (warm)"
				python3 bench/peers/table.py "$out/peers.jsonl" "$out/replay_cuda.jsonl" --warm
			} >"$out/table.md" 2>&1 || true
			;;
		*)
			echo "unknown part $part" >&2
			exit 2
			;;
		esac
	done
	ls -l "$out" >&2
}

case ${1:-} in
build) build ;;
run) shift; run "$@" ;;
*) sed -n '2,25p' "$0"; exit 2 ;;
esac
