// Cross-object checks of a rendered deployment that schemas cannot make:
//
//   node consistency.mjs BIN_DIR RENDERED.yaml...
//
// - container args name only flags the Sluice binaries accept (their
//   --helpfull, run from BIN_DIR);
// - --listen / --metrics_listen / --health_listen ports equal the grpc /
//   metrics / health containerPorts; probes use the health port when
//   --health_listen is set, else the grpc port, and never a TLS listener
//   (the kubelet's gRPC probes speak plaintext);
// - data servers register over TLS (--coordinator_ca) with a coordinator
//   that listens with TLS, and in plaintext with one that does not;
// - every Service, PodDisruptionBudget, NetworkPolicy and ServiceMonitor
//   selects something, workload selectors match their pod templates, Service
//   targetPorts exist on the selected pods, a StatefulSet's serviceName is a
//   headless Service;
// - every ConfigMap and PersistentVolumeClaim referenced exists in the same
//   render; no Secret is rendered (secret values never ship), and every
//   Secret referenced (and key) is one the operator creates as
//   k8s/README.md says (OPERATOR_SECRETS).
// Prints every problem with the file and object, exit status 1 if any.
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { parseAllDocuments } from "yaml";

const [binDir, ...files] = process.argv.slice(2);
if (!binDir || files.length === 0) {
  console.error("usage: node consistency.mjs BIN_DIR RENDERED.yaml...");
  process.exit(2);
}

// The Secrets the operator creates before applying an overlay, and their
// keys (k8s/README.md, "Secrets").
const OPERATOR_SECRETS = {
  "sluice-lease-secret": ["secret"],
  "sluice-admin-token": ["token"],
  "sluice-coordinator-tls": ["tls.crt", "tls.key", "ca.crt"],
  "sluice-dataserver-tls": ["tls.crt", "tls.key", "ca.crt"],
};

const flagCache = new Map();
function flagsOf(binary) {
  if (!flagCache.has(binary)) {
    let text = "";
    try {
      text = execFileSync(join(binDir, binary), ["--helpfull"], { encoding: "utf8" });
    } catch (e) {
      text = (e.stdout ?? "") + (e.stderr ?? "");  // absl exits 1 after --helpfull
    }
    flagCache.set(binary, new Set([...text.matchAll(/^\s+--([a-z0-9_]+) \(/gm)].map((m) => m[1])));
  }
  return flagCache.get(binary);
}

const matches = (selector, labels) =>
  Object.entries(selector ?? {}).every(([k, v]) => labels?.[k] === v);
const matchesExpressions = (exprs, labels) =>
  (exprs ?? []).every((e) => e.operator === "In" ? e.values.includes(labels?.[e.key]) : true);
const portOf = (address) => Number(String(address).split(":").pop());

let problems = 0;
for (const file of files) {
  const objects = parseAllDocuments(readFileSync(file, "utf8")).map((d) => d.toJS()).filter(Boolean);
  const bad = (obj, what) => {
    console.error(`${file}: ${obj.kind}/${obj.metadata.name}: ${what}`);
    problems++;
  };
  const byKind = (kind) => objects.filter((o) => o.kind === kind);
  const named = (kind, name) => objects.find((o) => o.kind === kind && o.metadata.name === name);
  const workloads = objects.filter((o) =>
    ["Deployment", "StatefulSet", "DaemonSet", "Job"].includes(o.kind));
  const podLabels = (w) => w.spec.template.metadata?.labels ?? {};
  for (const secret of byKind("Secret")) {
    bad(secret, "a rendered Secret ships its value with the manifests; the operator creates it");
  }

  for (const w of workloads) {
    if (w.kind !== "Job" && !matches(w.spec.selector?.matchLabels, podLabels(w))) {
      bad(w, "selector.matchLabels do not match the pod template's labels");
    }
    const pod = w.spec.template.spec;
    for (const c of pod.containers) {
      const binary = (c.command ?? [])[0]?.split("/").pop() ?? "";
      const ports = Object.fromEntries((c.ports ?? []).map((p) => [p.name, p.containerPort]));
      if (binary.startsWith("sluice")) {
        const known = flagsOf(binary);
        for (const arg of c.args ?? []) {
          const flag = arg.match(/^--([a-z0-9_]+)/)?.[1];
          if (!flag) bad(w, `${c.name}: argument "${arg}" is not a --flag`);
          else if (!known.has(flag)) bad(w, `${c.name}: ${binary} has no flag --${flag}`);
        }
        const arg = (name) => (c.args ?? []).find((a) => a.startsWith(`--${name}=`))?.split("=")[1];
        if (portOf(arg("listen")) !== ports.grpc) {
          bad(w, `${c.name}: --listen port ${portOf(arg("listen"))} != containerPort grpc ${ports.grpc}`);
        }
        if (portOf(arg("metrics_listen")) !== ports.metrics) {
          bad(w, `${c.name}: --metrics_listen port != containerPort metrics ${ports.metrics}`);
        }
        const health = arg("health_listen");
        if (health !== undefined && portOf(health) !== ports.health) {
          bad(w, `${c.name}: --health_listen port ${portOf(health)} != containerPort health ${ports.health}`);
        }
        const probePort = health !== undefined ? ports.health : ports.grpc;
        for (const probe of ["startupProbe", "livenessProbe", "readinessProbe"]) {
          if (!c[probe]) continue;
          if (c[probe].grpc?.port !== probePort) {
            bad(w, `${c.name}: ${probe} does not use the ${health !== undefined ? "health" : "grpc"} port ${probePort}`);
          }
          if (c[probe].grpc?.port === ports.grpc && arg("tls_cert") !== undefined) {
            bad(w, `${c.name}: ${probe} asks the TLS listener; the kubelet's gRPC probes speak plaintext (use --health_listen)`);
          }
        }
        if (c.readinessProbe?.grpc?.service !== "readiness") {
          bad(w, `${c.name}: readinessProbe must ask the "readiness" health service`);
        }
      }
      // Variables in args must be defined in env.
      const env = new Set((c.env ?? []).map((e) => e.name));
      for (const arg of [...(c.args ?? []), ...(c.command ?? [])]) {
        for (const m of arg.matchAll(/\$\(([A-Z_][A-Z0-9_]*)\)/g)) {
          if (!env.has(m[1])) bad(w, `${c.name}: $(${m[1]}) in args is not in env`);
        }
      }
      for (const e of c.env ?? []) {
        const ref = e.valueFrom?.configMapKeyRef ?? e.valueFrom?.secretKeyRef;
        if (!ref) continue;
        const kind = e.valueFrom.configMapKeyRef ? "ConfigMap" : "Secret";
        if (kind === "Secret") {
          if (!(OPERATOR_SECRETS[ref.name] ?? []).includes(ref.key)) {
            bad(w, `${c.name}: env ${e.name} references Secret ${ref.name} key ${ref.key}, not one the operator creates`);
          }
          continue;
        }
        const target = named(kind, ref.name);
        if (!target) bad(w, `${c.name}: env ${e.name} references missing ${kind} ${ref.name}`);
        else if (!({ ...target.data, ...target.stringData })[ref.key] && !ref.optional) {
          bad(w, `${c.name}: env ${e.name}: ${kind} ${ref.name} has no key ${ref.key}`);
        }
      }
      // A StatefulSet's volumeClaimTemplates are volumes of its pods too.
      const volumes = new Set([...(pod.volumes ?? []), ...(w.spec.volumeClaimTemplates ?? [])]
        .map((v) => v.name ?? v.metadata?.name));
      for (const m of c.volumeMounts ?? []) {
        if (!volumes.has(m.name)) bad(w, `${c.name}: volumeMount ${m.name} has no volume`);
      }
    }
    for (const v of pod.volumes ?? []) {
      if (v.secret && !OPERATOR_SECRETS[v.secret.secretName]) {
        bad(w, `volume ${v.name} references Secret ${v.secret.secretName}, not one the operator creates`);
      }
      for (const item of v.secret?.items ?? []) {
        if (!(OPERATOR_SECRETS[v.secret.secretName] ?? []).includes(item.key)) {
          bad(w, `volume ${v.name}: Secret ${v.secret.secretName} has no key ${item.key}`);
        }
      }
      if (v.configMap && !named("ConfigMap", v.configMap.name)) {
        bad(w, `volume ${v.name} references missing ConfigMap ${v.configMap.name}`);
      }
      if (v.persistentVolumeClaim && !named("PersistentVolumeClaim", v.persistentVolumeClaim.claimName)) {
        bad(w, `volume ${v.name} references missing PVC ${v.persistentVolumeClaim.claimName}`);
      }
    }
    if (w.kind === "StatefulSet") {
      const svc = named("Service", w.spec.serviceName);
      if (!svc || svc.spec.clusterIP !== "None") {
        bad(w, `serviceName ${w.spec.serviceName} is not a headless Service in the render`);
      }
    }
  }

  // Registration: TLS on both sides, or on neither.
  const sluiceArgs = (binary) => workloads.flatMap((w) => w.spec.template.spec.containers
    .filter((c) => (c.command ?? [])[0]?.split("/").pop() === binary)
    .map((c) => ({ w, args: c.args ?? [] })));
  const coordinatorTls = sluiceArgs("sluice-coordinator")
    .some(({ args }) => args.some((a) => a.startsWith("--tls_cert=")));
  for (const { w, args } of sluiceArgs("sluice-dataserver")) {
    const registersTls = args.some((a) => a.startsWith("--coordinator_ca="));
    if (coordinatorTls && !registersTls) {
      bad(w, "the coordinator listens with TLS but the data servers register in plaintext (no --coordinator_ca)");
    } else if (!coordinatorTls && registersTls) {
      bad(w, "the data servers register with TLS (--coordinator_ca) but the coordinator listens in plaintext");
    }
  }

  for (const svc of byKind("Service")) {
    const selected = workloads.filter((w) => matches(svc.spec.selector, podLabels(w)));
    if (selected.length === 0) {
      bad(svc, "selects no workload's pods");
      continue;
    }
    for (const p of svc.spec.ports) {
      const target = p.targetPort ?? p.port;
      const found = selected.some((w) => w.spec.template.spec.containers.some((c) =>
        (c.ports ?? []).some((cp) => cp.containerPort === target || cp.name === target)));
      // A Job's rendezvous port is opened by the program, not declared.
      if (!found && !selected.every((w) => w.kind === "Job")) {
        bad(svc, `port ${p.name}: targetPort ${target} is not a containerPort of the selected pods`);
      }
    }
  }
  for (const o of [...byKind("PodDisruptionBudget"), ...byKind("NetworkPolicy")]) {
    const selector = o.kind === "NetworkPolicy" ? o.spec.podSelector : o.spec.selector;
    if (!workloads.some((w) => matches(selector.matchLabels, podLabels(w)))) {
      bad(o, "selects no workload's pods");
    }
  }
  for (const sm of byKind("ServiceMonitor")) {
    const services = byKind("Service").filter((s) =>
      matches(sm.spec.selector.matchLabels, s.metadata.labels) &&
      matchesExpressions(sm.spec.selector.matchExpressions, s.metadata.labels));
    if (services.length === 0) bad(sm, "selects no Service");
    for (const ep of sm.spec.endpoints) {
      for (const s of services) {
        if (!s.spec.ports.some((p) => p.name === ep.port)) {
          bad(sm, `Service ${s.metadata.name} has no port named ${ep.port}`);
        }
      }
    }
  }
}
if (problems > 0) {
  console.error(`FAILED: ${problems} problem(s)`);
  process.exit(1);
}
console.log(`ok: ${files.length} file(s) consistent`);
