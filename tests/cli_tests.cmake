# Contract tests of the `moekit` command-line tool (docs/cli.md): exit codes, the listing, the JSON
# keys. Each test runs the built binary through `sh -c SCRIPT BINARY`, so inside SCRIPT "$0" is the
# binary. Run them with `ctest -L cli`. Tests labelled `needs-hooks` need the op harness hooks
# (src/testing/check_*.cpp): with a stub hook `check` and `bench` run nothing and exit 1.
# Included from tests/CMakeLists.txt when MOEKIT_BUILD_TOOLS is on.

find_program(MOEKIT_PYTHON3 python3)

# moekit_cli_test(NAME SCRIPT [LABELS ...]): SCRIPT must exit 0 for the test to pass.
function(moekit_cli_test name script)
  add_test(NAME cli.${name} COMMAND sh -c "${script}" "$<TARGET_FILE:moekit_cli>")
  set_tests_properties(cli.${name} PROPERTIES LABELS "cli;${ARGN}" TIMEOUT 300)
endfunction()

# moekit_cli_usage_error(NAME FLAG ARGS...): `moekit ARGS...` must exit exactly 2 and print exactly
# one line on stderr that mentions FLAG (the flag whose value is bad).
function(moekit_cli_usage_error name flag)
  list(JOIN ARGN " " args)
  moekit_cli_test(usage.${name}
    "err=$(\"$0\" ${args} 2>&1 >/dev/null); rc=$?; echo \"rc=$rc: $err\"; test $rc -eq 2 && test \"$(printf '%s\\n' \"$err\" | wc -l)\" -eq 1 && printf '%s' \"$err\" | grep -q -F -e '${flag}'")
endfunction()

# ---- version, help, listing
moekit_cli_test(version "out=$(\"$0\" --version) && echo \"$out\" && test \"$out\" = 'moekit ${PROJECT_VERSION}'")
moekit_cli_test(help "out=$(\"$0\" --help) && echo \"$out\" | grep -q check && echo \"$out\" | grep -q bench")
moekit_cli_test(ops
  "out=$(\"$0\" ops) || exit 1; echo \"$out\"; for w in topk_softmax_ref fused_moe sort_tokens ref cpu cuda; do echo \"$out\" | grep -q -w $w || exit 1; done")

# ---- bad arguments: exit 2 with one line naming the flag (docs/cli.md, "Exit codes")
moekit_cli_usage_error(unknown_model --model check --model foo)
moekit_cli_usage_error(unknown_op --op check --op nope)
moekit_cli_usage_error(unknown_backend --backend check --backend gpu)
moekit_cli_usage_error(bad_scheme --scheme check --scheme fp9)
moekit_cli_usage_error(bad_activation --activation check --activation relu)
moekit_cli_usage_error(topk_gt_experts --topk check --experts 8 --topk 9)
moekit_cli_usage_error(negative_size --experts check --experts -3)
moekit_cli_usage_error(bad_size --hidden check --hidden 12x)
moekit_cli_usage_error(malformed_tokens --tokens check --tokens 1,,8)
moekit_cli_usage_error(malformed_tokens_text --tokens check --tokens 1,x)
moekit_cli_usage_error(negative_tokens --tokens check --tokens -1)
moekit_cli_usage_error(bad_seed --seed check --seed abc)
moekit_cli_usage_error(unknown_flag --bogus check --bogus)
moekit_cli_usage_error(missing_value --experts check --experts)
moekit_cli_usage_error(no_subcommand subcommand)
moekit_cli_usage_error(bench_missing_op --op bench)
moekit_cli_usage_error(bench_unknown_model --model bench --op topk_softmax --model foo)
moekit_cli_usage_error(custom_model_needs_sizes --model check --model custom)
moekit_cli_usage_error(bench_ep_needs_fused_moe --ep bench --op topk_softmax --ep 2)
moekit_cli_usage_error(bench_zero_tokens --tokens bench --op topk_softmax --tokens 0)
moekit_cli_usage_error(bench_zero_iters --iters bench --op topk_softmax --iters 0)
moekit_cli_usage_error(bench_bad_l2 --l2 bench --op topk_softmax --l2 warm)
moekit_cli_usage_error(bench_bad_peak --peak-gbps bench --op topk_softmax --peak-gbps -5)
moekit_cli_usage_error(bench_unknown_kernel --kernel bench --op fused_moe --kernel fused_moe_sm90)
moekit_cli_usage_error(bench_kernel_of_other_op --kernel bench --op topk_softmax --backend ref --kernel topk_softmax_ref,fused_moe_ref)
moekit_cli_usage_error(ops_unknown_flag --bogus ops --bogus)

# ---- an explicitly requested backend that cannot run here is a failure (exit 1), not a pass
if(NOT MOEKIT_WITH_CUDA)
  moekit_cli_test(check_unavailable_backend
    "err=$(\"$0\" check --backend cuda 2>&1 >/dev/null); rc=$?; echo \"rc=$rc: $err\"; test $rc -eq 1 && printf '%s' \"$err\" | grep -q cuda")
  moekit_cli_test(bench_unavailable_backend
    "\"$0\" bench --op topk_softmax --backend cuda --tokens 1 >/dev/null; test $? -eq 1")
endif()

# ---- check and bench through the harness hooks
moekit_cli_test(check_topk_softmax_ref "\"$0\" check --op topk_softmax --backend ref" needs-hooks)
# --model custom: the size flags' shape alone, no preset.
moekit_cli_test(check_model_custom
  "out=$(\"$0\" check --op fused_moe --backend ref --model custom --experts 4 --topk 2 --hidden 64 --inter 64 --tokens 3 --no-edge-cases --json) || exit 1; echo \"$out\" | grep -q 'custom E=4' && ! echo \"$out\" | grep -q mixtral" needs-hooks)

if(MOEKIT_PYTHON3)
  # JSON output: valid, and every stable key present (docs/cli.md lists them).
  moekit_cli_test(ops_json
    "\"$0\" ops --json > ops.json || exit 1; \"${MOEKIT_PYTHON3}\" -c \"import json; d = json.load(open('ops.json')); \
assert len(d['ops']) == 11, d['ops']; assert [b['name'] for b in d['backends']] == ['ref', 'cpu', 'cuda']; \
assert 'topk_softmax_ref' in [k['name'] for k in d['kernels']]; \
keys = {'name', 'op', 'variant', 'backend', 'recipe', 'priority', 'available', 'reason'}; \
assert all(keys <= set(k) for k in d['kernels'])\"")
  moekit_cli_test(check_json
    "\"$0\" check --op topk_softmax --backend ref --model mixtral --tokens 1,8 --json > check.json || exit 1; \
\"${MOEKIT_PYTHON3}\" -c \"import json; d = json.load(open('check.json')); assert d and all(c['ok'] for c in d); \
keys = {'op', 'kernel', 'backend', 'case', 'reference', 'ok', 'max_abs_err', 'max_rel_err', 'cosine', 'rms_ratio', \
'mismatches', 'count', 'finite', 'worst', 'detail'}; missing = [keys - set(c) for c in d if not keys <= set(c)]; \
assert not missing, missing\"" needs-hooks)
  # The layout / quantization ops bench on host kernels (bytes only, no flops).
  moekit_cli_test(bench_layout_quant_ops
    "for op in quantize_fp8 convert_fp8 shuffle_weight unpack_weight; do \
\"$0\" bench --op $op --backend ref --model qwen3-moe --tokens 8 --iters 2 --json > lq.json || exit 1; \
\"${MOEKIT_PYTHON3}\" -c \"import json; d = json.load(open('lq.json')); assert d and all(r['status'] == 'ok' and r['time_us'] > 0 for r in d), d\" || exit 1; done" needs-hooks)
  moekit_cli_test(bench_json
    "\"$0\" bench --op topk_softmax --backend ref --tokens 1,8 --iters 3 --json > bench.json || exit 1; \
\"${MOEKIT_PYTHON3}\" -c \"import json; d = json.load(open('bench.json')); ok = [r for r in d if r['status'] == 'ok']; \
assert ok and {r['tokens'] for r in ok} == {1, 8}, d; \
keys = {'op', 'kernel', 'backend', 'scheme', 'tokens', 'time_us', 'tflops', 'gbps', 'mem_floor_us', \
'compute_floor_us', 'frac_floor'}; assert all(keys <= set(r) for r in d); assert all(r['time_us'] > 0 for r in ok)\"" needs-hooks)
  # --compare ref: every ok row of the CPU fused_moe kernel also carries the reference's time.
  moekit_cli_test(bench_compare_ref
    "\"$0\" bench --op fused_moe --backend cpu --model qwen3-moe --tokens 1 --iters 2 --compare ref --json > cmp.json || exit 1; \
\"${MOEKIT_PYTHON3}\" -c \"import json; d = json.load(open('cmp.json')); ok = [r for r in d if r['status'] == 'ok']; \
assert ok, d; assert all(r['compare_kernel'] == 'fused_moe_ref' and r['compare_us'] > 0 and r['speedup'] > 0 for r in ok), d\"" needs-hooks)
  # --peak-gbps / --peak-gflops replace the measurement and set the floors exactly.
  moekit_cli_test(bench_peak_override
    "\"$0\" bench --op topk_softmax --backend ref --model mixtral --tokens 8 --iters 3 --peak-gbps 100 --peak-gflops 1000 --json > peak.json || exit 1; \
\"${MOEKIT_PYTHON3}\" -c \"import json; d = [r for r in json.load(open('peak.json')) if r['status'] == 'ok']; assert d; \
assert all(r['peak_gbps'] == 100 and r['peak_gflops'] == 1000 for r in d); \
assert all(abs(r['mem_floor_us'] - r['bytes'] / 100e3) < 1e-9 for r in d)\"" needs-hooks)
else()
  message(STATUS "moekit: python3 not found, the cli JSON tests are not registered")
endif()

# ---- the model runner on the committed smoke models (tests/data/models): eval prints one table row
# per model x scheme with the logit agreement against the PyTorch reference; run generates.
set(MOEKIT_SMOKE_MODELS "${PROJECT_SOURCE_DIR}/tests/data/models")
moekit_cli_test(eval_smoke_models
  "out=$(\"$0\" eval --model ${MOEKIT_SMOKE_MODELS} --data ${PROJECT_SOURCE_DIR}/models/data/arith_test.jsonl --limit 4 --scheme f32,fp8_block) || exit 1; echo \"$out\"; test \"$(echo \"$out\" | grep -c '| arith | 0 | exact_match |')\" -eq 6 && echo \"$out\" | grep -q '| mixtral-tiny-smoke | cpu | f32 |.*| 1.0000 |'")
moekit_cli_test(run_smoke_model
  "out=$(\"$0\" run --model ${MOEKIT_SMOKE_MODELS}/llama4-tiny-smoke --prompt 'Q: 1+1?' --max-new 5 2>&1) || exit 1; echo \"$out\"; echo \"$out\" | grep -q 'tokens/s'")
moekit_cli_usage_error(eval_bad_scheme --scheme eval --model ${MOEKIT_SMOKE_MODELS} --scheme fp9)
moekit_cli_usage_error(eval_bad_backend --backend eval --model ${MOEKIT_SMOKE_MODELS} --backend gpu)
# A backend this machine cannot run: exit 2 naming it before any row (no half table); where a CUDA
# device is present the check does not apply.
moekit_cli_test(eval_unavailable_backend
  "if \"$0\" ops | grep -qE '^  cuda +available'; then echo 'cuda available here: nothing to check'; exit 0; fi; \
out=$(\"$0\" eval --model ${MOEKIT_SMOKE_MODELS}/llama4-tiny-smoke --data ${PROJECT_SOURCE_DIR}/models/data/arith_test.jsonl \
--limit 1 --backend cpu,cuda 2>err.txt); rc=$?; cat err.txt; test $rc -eq 2 && test -z \"$out\" && grep -q -e '--backend cuda' err.txt")

# ---- hostile input (issue 28): exit 2 with one line naming the path or the numbers, never a hang,
# a crash or "internal error"; a request too large for the machine is refused before allocating.
moekit_cli_usage_error(run_empty_model "empty path" run --model "''" --prompt x)
moekit_cli_usage_error(eval_data_is_a_folder "--data: ${PROJECT_SOURCE_DIR}/models/data is a directory"
  eval --model ${MOEKIT_SMOKE_MODELS}/llama4-tiny-smoke --data ${PROJECT_SOURCE_DIR}/models/data --limit 1)
# A FIFO as --data or as a model's config.json used to block forever (timeout 20 s here); a folder as
# config.json used to be "internal error", exit 1.
moekit_cli_test(eval_data_is_a_fifo
  "d=$(mktemp -d) && mkfifo $d/p.jsonl || exit 1; err=$(timeout 20 \"$0\" eval --model ${MOEKIT_SMOKE_MODELS}/llama4-tiny-smoke \
--data $d/p.jsonl --limit 1 2>&1 >/dev/null); rc=$?; rm -r $d; echo \"rc=$rc: $err\"; test $rc -eq 2 && printf '%s' \"$err\" | grep -q 'is a FIFO, not a regular file'")
moekit_cli_test(run_config_is_a_folder
  "d=$(mktemp -d) && mkdir $d/config.json || exit 1; err=$(timeout 20 \"$0\" run --model $d --prompt x 2>&1 >/dev/null); rc=$?; \
rm -r $d; echo \"rc=$rc: $err\"; test $rc -eq 2 && printf '%s' \"$err\" | grep -q 'config.json is a directory, not a regular file'")
moekit_cli_test(run_safetensors_is_a_fifo
  "d=$(mktemp -d) && m=${MOEKIT_SMOKE_MODELS}/llama4-tiny-smoke && ln -s $m/config.json $m/tokenizer.json $d/ && mkfifo $d/model.safetensors || exit 1; \
err=$(timeout 20 \"$0\" run --model $d --prompt x 2>&1 >/dev/null); rc=$?; rm -r $d; echo \"rc=$rc: $err\"; \
test $rc -eq 2 && printf '%s' \"$err\" | grep -q 'model.safetensors is a FIFO, not a regular file'")
# Each size flag is within its bound, together they need terabytes (--hidden x --inter) or hundreds
# of GB (--tokens): refused at once with the estimate and what the machine has. `ulimit -v` (8 GB)
# makes the --tokens case independent of the machine's memory.
foreach(cmd check bench)
  moekit_cli_usage_error(${cmd}_hidden_inter_too_large "host memory"
    ${cmd} --op fused_moe --backend cpu --model mixtral --hidden 1048576 --inter 1048576 --tokens 1)
  moekit_cli_test(usage.${cmd}_tokens_too_large
    "err=$(ulimit -v 8000000; timeout 60 \"$0\" ${cmd} --op fused_moe --backend cpu --model mixtral --tokens 4194304 2>&1 >/dev/null); \
rc=$?; echo \"rc=$rc: $err\"; test $rc -eq 2 && test \"$(printf '%s\\n' \"$err\" | wc -l)\" -eq 1 && \
printf '%s' \"$err\" | grep -q -e '--tokens 4194304: fused_moe on cpu, mixtral-small .* needs about .* GB of host memory, this machine has .* GB available'")
endforeach()
