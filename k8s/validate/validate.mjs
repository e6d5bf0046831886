// Strict, offline schema validation of rendered Kubernetes manifests.
//
//   node validate.mjs RENDERED.yaml...
//
// Every object of every file becomes a typed constant in a generated
// TypeScript file, e.g.
//   import type { IDeployment } from "kubernetes-models/apps/v1/Deployment";
//   export const o3: IDeployment = { ...the object as a literal... };
// and `tsc --noEmit --strict` over them rejects unknown fields anywhere in an
// object (excess-property checks on literals: `replicass` fails) and wrong
// types. Each object is also checked at run time against the models' JSON
// schemas (`validate()`: formats such as quantities). Exit status 1 on any
// error, naming the file, object and field.
import { spawnSync } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseAllDocuments } from "yaml";

const here = dirname(fileURLToPath(import.meta.url));
const files = process.argv.slice(2);
if (files.length === 0) {
  console.error("usage: node validate.mjs RENDERED.yaml...");
  process.exit(2);
}
// Beside node_modules, so the generated imports resolve (tsconfig.json
// includes .gen/*.ts).
const outDir = join(here, ".gen");
rmSync(outDir, { recursive: true, force: true });

function modulePath(apiVersion, kind) {
  if (apiVersion.startsWith("monitoring.coreos.com/")) {
    return `@kubernetes-models/prometheus-operator/${apiVersion}/${kind}`;
  }
  return `kubernetes-models/${apiVersion}/${kind}`;
}

mkdirSync(outDir, { recursive: true });
const generated = [];
let errors = 0;
for (const file of files) {
  const docs = parseAllDocuments(readFileSync(file, "utf8"));
  const imports = new Map();
  const decls = [];
  for (const [i, doc] of docs.entries()) {
    if (doc.errors.length > 0) {
      console.error(`${file}: document ${i}: ${doc.errors[0].message}`);
      errors++;
      continue;
    }
    const obj = doc.toJS();
    if (obj === null) continue;
    const { apiVersion, kind } = obj;
    const name = `${kind}/${obj.metadata?.name ?? "?"}`;
    const path = modulePath(apiVersion, kind);
    let model;
    try {
      model = await import(path);
    } catch {
      console.error(`${file}: ${name}: no schema for apiVersion ${apiVersion} kind ${kind}`);
      errors++;
      continue;
    }
    try {
      new model[kind](obj).validate();
    } catch (e) {
      console.error(`${file}: ${name}: ${e.message}`);
      errors++;
    }
    const alias = `I${kind}_${imports.size}`;
    if (!imports.has(path)) imports.set(path, alias);
    decls.push(`// ${name}\nexport const o${i}: ${imports.get(path)} = ${JSON.stringify(obj, null, 2)};`);
  }
  const ts =
    [...imports].map(([p, a]) => `import type { I${p.split("/").pop()} as ${a} } from "${p}";`).join("\n") +
    "\n\n" + decls.join("\n\n") + "\n";
  const out = join(outDir, basename(file).replace(/\.ya?ml$/, "") + ".ts");
  writeFileSync(out, ts);
  generated.push(out);
}

const tsc = spawnSync(
  join(here, "node_modules", ".bin", "tsc"), ["-p", join(here, "tsconfig.json")],
  { encoding: "utf8", cwd: here });
if (tsc.status !== 0) {
  process.stderr.write(tsc.stdout + tsc.stderr);
  errors++;
}
if (errors > 0) {
  console.error(`FAILED: ${errors} problem(s) in ${files.join(", ")}`);
  process.exit(1);
}
console.log(`ok: ${files.length} file(s), every object valid`);
