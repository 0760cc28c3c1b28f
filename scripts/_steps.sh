# Sourced by scripts/test.sh and scripts/test_environments.sh: `step CMD...` runs CMD and, when it
# fails, records it and goes on; `first_status` keeps the first failure's exit status (a fixed
# selection that collects no test, pytest's 5, counts as a failure: 1) and `failed` lists them.
failed=()
first_status=0
step() {
  echo "+ $*"
  "$@"
  local status=$?
  if [ "$status" -ne 0 ]; then
    echo "${0##*/}: FAILED (exit $status): $*" >&2
    failed+=("$* (exit $status)")
    [ "$first_status" -ne 0 ] || { [ "$status" -eq 5 ] && first_status=1 || first_status=$status; }
  fi
}
