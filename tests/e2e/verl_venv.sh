# shellcheck shell=bash
# Sourced by the e2e scripts that run against verl itself (verl_dataset_e2e.sh, verl_sampler_e2e.sh).
# make_verl_venv WORK VERL TENSORDICT: WORK/venv layered over .venv (its site packages added), with verl (a pip
# requirement, such as verl==0.7.0) and what verl's data set and DataProto import, none with its own dependencies.
make_verl_venv() {
  local work=$1 verl=$2 tensordict=$3 site
  python3 -m venv "$work/venv"
  site=$("$work/venv/bin/python" -c "import site; print(site.getsitepackages()[0])")
  echo "import site; site.addsitedir('$(.venv/bin/python -c "import site; print(site.getsitepackages()[0])")')" \
    >"$site/main.pth"
  "$work/venv/bin/pip" install -q --no-deps "$verl" "$tensordict" pyvers torchdata codetiming hydra-core omegaconf \
    antlr4-python3-runtime==4.9.3 dill pylatexenc cloudpickle datasets multiprocess xxhash
}
