//! The Kubernetes deployment in `deploy/kubernetes/` and the image (issue 7):
//!
//! * `prometheusrule.yaml` is, byte for byte, what `scripts/gen-prometheusrule.py`
//!   makes of `alerts/inboxwatch.rules.yml`, and its `spec` parses to exactly that
//!   file, so the two cannot drift;
//! * the ConfigMap carries `config/inboxwatch.toml` unchanged, and `inboxwatch
//!   check-config` accepts it with the environment the example Secret provides,
//!   whose keys are exactly the `${VAR}`s the config reads;
//! * `kubernetes-validate --strict` accepts every manifest: the core objects are
//!   validated against the Kubernetes schemas (each must be reported as passed),
//!   the PodMonitor, PrometheusRule and Kustomization it has no schema for are only
//!   tolerated;
//! * the DaemonSet's security settings, probes, grace period and resources, and the
//!   names that tie the objects and the Dockerfile together.
//!
//! Needs `python3` and `kubernetes-validate` (PyPI; it brings PyYAML, which reads the
//! manifests here). Without them the tests fail, saying so; they never skip.

use crate::common;

use std::collections::BTreeSet;

use serde_json::Value;

use base64::Engine as _;
use common::process::run_in_root;
use common::{Cmd, Outcome, repo_path, repo_read};

const DEPLOY: &str = "deploy/kubernetes";
const INSTALL_HINT: &str = "install it with `python3 -m pip install kubernetes-validate` \
     (it brings PyYAML too; CI's scripts/test.sh installs it)";

/// Manifests that are examples to copy, not resources of the kustomization.
const NOT_RESOURCES: &[&str] = &[
    "kustomization.yaml",
    "secret.example.yaml",
    "web-secret.example.yaml",
];

/// Objects kubernetes-validate must validate against its schemas: (kind, name).
const CORE_OBJECTS: &[(&str, &str)] = &[
    ("ServiceAccount", "inboxwatch"),
    ("ConfigMap", "inboxwatch-config"),
    ("Secret", "inboxwatch-db"),
    ("Secret", "inboxwatch-web"),
    ("DaemonSet", "inboxwatch"),
    ("Service", "inboxwatch"),
];

/// Kinds it has no schema for (custom resources, kustomize's own file): tolerated.
const KINDS_WITHOUT_SCHEMA: &[&str] = &["PodMonitor", "PrometheusRule", "Kustomization"];

// ---------------------------------------------------------------------------
// Helpers

fn python(args: &[&str]) -> Outcome {
    run_in_root("python3", args).unwrap_or_else(|e| {
        panic!("cannot run python3 ({e}); it is needed for the deployment checks")
    })
}

/// The YAML documents of a file (relative to the root), read by PyYAML, as JSON.
fn load_yaml(path: &str) -> Vec<Value> {
    let out = python(&[
        "-c",
        "import json, sys, yaml\n\
         docs = yaml.safe_load_all(open(sys.argv[1], encoding='utf-8'))\n\
         json.dump([d for d in docs if d is not None], sys.stdout)",
        path,
    ]);
    assert!(
        out.success(),
        "cannot read {path} as YAML; if PyYAML is missing, {INSTALL_HINT}:\n{}",
        out.describe()
    );
    serde_json::from_str(&out.stdout).expect("python3 printed JSON")
}

/// The one object of `kind` in a manifest file.
fn object(file: &str, kind: &str) -> Value {
    let mut found: Vec<Value> = load_yaml(&format!("{DEPLOY}/{file}"))
        .into_iter()
        .filter(|d| d["kind"] == kind)
        .collect();
    assert_eq!(found.len(), 1, "{DEPLOY}/{file} must hold one {kind}");
    found.remove(0)
}

/// The `.yaml` files of `deploy/kubernetes/`, by file name, sorted.
fn manifests() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(repo_path(DEPLOY))
        .unwrap_or_else(|e| panic!("cannot read {DEPLOY}/: {e}"))
        .map(|e| {
            e.expect("directory entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.ends_with(".yaml") || n.ends_with(".yml"))
        .collect();
    names.sort();
    names
}

/// The content of the block scalar `inboxwatch.toml: |` in the ConfigMap's text.
fn configmap_toml(manifest: &str) -> String {
    let mut lines = manifest.lines();
    lines
        .by_ref()
        .find(|l| l.trim_end() == "  inboxwatch.toml: |")
        .unwrap_or_else(|| panic!("{DEPLOY}/configmap.yaml has no `  inboxwatch.toml: |` block"));
    let mut body = String::new();
    for line in lines {
        if let Some(content) = line.strip_prefix("    ") {
            body.push_str(content);
        } else if !line.trim().is_empty() {
            break;
        }
        body.push('\n');
    }
    // `|` keeps exactly one final newline.
    format!("{}\n", body.trim_end_matches('\n'))
}

/// The `${VAR}` names a config text reads (comment lines aside).
fn env_references(config: &str) -> BTreeSet<String> {
    config
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .flat_map(|l| l.split("${").skip(1))
        .filter_map(|rest| rest.split_once('}').map(|(name, _)| name.to_string()))
        .collect()
}

fn first_difference(expected: &str, actual: &str) -> String {
    let (mut e, mut a) = (expected.lines(), actual.lines());
    for number in 1.. {
        match (e.next(), a.next()) {
            (None, None) => break,
            (x, y) if x == y => {}
            (x, y) => return format!("line {number}: expected {x:?}, found {y:?}"),
        }
    }
    "only line endings differ".to_string()
}

// ---------------------------------------------------------------------------
// The PrometheusRule

/// Guards against the PrometheusRule drifting from the rule file: it must be what
/// the generator makes of it today.
#[test]
fn prometheusrule_is_generated_from_the_rule_file() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let generated = dir.path().join("prometheusrule.yaml");
    let out = python(&[
        "scripts/gen-prometheusrule.py",
        "--output",
        generated.to_str().expect("UTF-8 temporary path"),
    ]);
    assert!(out.success(), "the generator failed:\n{}", out.describe());
    let generated = std::fs::read_to_string(&generated).expect("generated manifest");
    let committed = repo_read(&format!("{DEPLOY}/prometheusrule.yaml"));
    assert!(
        generated == committed,
        "{DEPLOY}/prometheusrule.yaml is not what the generator makes of alerts/inboxwatch.rules.yml \
         ({}); run `python3 scripts/gen-prometheusrule.py` and commit the result",
        first_difference(&generated, &committed)
    );
}

#[test]
fn prometheusrule_spec_is_exactly_the_rule_files_groups() {
    let rule = object("prometheusrule.yaml", "PrometheusRule");
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["metadata"]["name"], "inboxwatch");
    let rules = load_yaml("alerts/inboxwatch.rules.yml");
    assert_eq!(
        rules.len(),
        1,
        "alerts/inboxwatch.rules.yml is one document"
    );
    assert!(
        rule["spec"] == rules[0],
        "the PrometheusRule's spec is not alerts/inboxwatch.rules.yml ({}); \
         run `python3 scripts/gen-prometheusrule.py`",
        first_differing_rule(&rule["spec"], &rules[0])
    );

    // What the PrometheusRule CRD's schema demands beyond Prometheus' own rule
    // files: string label and annotation values, `for` in its duration syntax.
    let groups = rule["spec"]["groups"].as_array().expect("spec.groups");
    assert!(!groups.is_empty(), "the rule file has groups");
    for group in groups {
        assert!(group["name"].is_string(), "every group has a name");
        for r in group["rules"].as_array().expect("every group has rules") {
            let name = r.get("alert").or(r.get("record")).expect("alert or record");
            assert!(r["expr"].is_string(), "{name}: expr is a string");
            for map in ["labels", "annotations"] {
                if let Some(m) = r.get(map) {
                    let m = m.as_object().expect("a map");
                    assert!(
                        m.values().all(Value::is_string),
                        "{name}: {map} are strings"
                    );
                }
            }
            if let Some(d) = r.get("for") {
                let d = d.as_str().unwrap_or_default();
                assert!(
                    is_prometheus_duration(d),
                    "{name}: `for: {d}` is no duration"
                );
            }
        }
    }
}

/// Names the first rule (or group) where two rule documents differ.
fn first_differing_rule(ours: &Value, theirs: &Value) -> String {
    let list = |v: &Value, key: &str| v[key].as_array().cloned().unwrap_or_default();
    let (groups, other_groups) = (list(ours, "groups"), list(theirs, "groups"));
    for (g, h) in groups.iter().zip(&other_groups) {
        let (rules, other_rules) = (list(g, "rules"), list(h, "rules"));
        for (r, q) in rules.iter().zip(&other_rules) {
            if r != q {
                let name = r.get("alert").or(r.get("record")).unwrap_or(&r["expr"]);
                return format!("group {}, rule {name}", g["name"]);
            }
        }
        if g != h {
            return format!("group {}", g["name"]);
        }
    }
    format!("{} groups against {}", groups.len(), other_groups.len())
}

/// Prometheus' duration syntax, as the CRD's pattern accepts it: `0`, or units
/// from years down to milliseconds, each at most once, in that order (`1h30m`).
fn is_prometheus_duration(text: &str) -> bool {
    const UNITS: [&str; 7] = ["y", "w", "d", "h", "m", "s", "ms"];
    if text == "0" {
        return true;
    }
    let mut rest = text;
    let mut next_unit = 0;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        // "ms" before "m", so that "5ms" is not read as minutes.
        let Some(unit) = (next_unit..UNITS.len())
            .filter(|&i| rest.starts_with(UNITS[i]))
            .max_by_key(|&i| UNITS[i].len())
        else {
            return false;
        };
        rest = &rest[UNITS[unit].len()..];
        next_unit = unit + 1;
    }
    !text.is_empty()
}

#[test]
fn prometheus_durations_are_recognised() {
    for good in ["0", "5m", "1h30m", "10s", "500ms", "1y2w3d4h5m6s7ms"] {
        assert!(is_prometheus_duration(good), "{good}");
    }
    for bad in ["", "5", "m", "5 m", "30m1h", "1.5h", "5mm", "1s1s"] {
        assert!(!is_prometheus_duration(bad), "{bad}");
    }
}

// ---------------------------------------------------------------------------
// The ConfigMap and the Secret

#[test]
fn configmap_holds_the_example_config_and_it_passes_check_config() {
    let config = configmap_toml(&repo_read(&format!("{DEPLOY}/configmap.yaml")));
    let example = repo_read("config/inboxwatch.toml");
    assert!(
        config == example,
        "{DEPLOY}/configmap.yaml's inboxwatch.toml differs from config/inboxwatch.toml ({}); \
         copy the file into the ConfigMap, indented by 4 spaces",
        first_difference(&example, &config)
    );

    // The example Secret provides exactly the variables the config reads.
    let secret = object("secret.example.yaml", "Secret");
    let values = secret["stringData"]
        .as_object()
        .expect("the Secret has stringData");
    let keys: BTreeSet<String> = values.keys().cloned().collect();
    assert_eq!(
        keys,
        env_references(&config),
        "the example Secret's keys must be the ${{VAR}}s the config reads"
    );

    let dir = tempfile::tempdir().expect("temporary directory");
    let file = dir.path().join("inboxwatch.toml");
    std::fs::write(&file, &config).expect("write the config");
    let out = Cmd::new(["check-config"])
        .arg(&file)
        .envs(
            values
                .iter()
                .map(|(key, value)| (key, value.as_str().expect("Secret values are strings"))),
        )
        .output();
    assert!(
        out.success(),
        "check-config rejects the ConfigMap's config:\n{}",
        out.describe()
    );
    assert_eq!(out.stdout.trim(), "config OK: 6 sources");
}

// ---------------------------------------------------------------------------
// Schema validation

/// Runs `kubernetes-validate --strict` on files (relative to the root): the
/// command, or the module of python3's where pip put no command on the PATH
/// (e.g. a pyenv without a rehash).
fn kubernetes_validate(files: &[String]) -> Outcome {
    let mut args = vec!["--strict"];
    args.extend(files.iter().map(String::as_str));
    match run_in_root("kubernetes-validate", &args) {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut args = vec!["-m", "kubernetes_validate", "--strict"];
            args.extend(files.iter().map(String::as_str));
            let out = python(&args);
            assert!(
                !out.stderr.contains("No module named kubernetes_validate"),
                "kubernetes-validate is not installed: {INSTALL_HINT}"
            );
            out
        }
        Err(e) => panic!("cannot run kubernetes-validate ({e}): {INSTALL_HINT}"),
    }
}

#[test]
fn manifests_validate_with_kubernetes_validate() {
    let files: Vec<String> = manifests()
        .iter()
        .map(|n| format!("{DEPLOY}/{n}"))
        .collect();
    let out = kubernetes_validate(&files);
    let report = out.describe();
    assert!(out.success(), "kubernetes-validate failed:\n{report}");

    let stdout = &out.stdout;
    for line in stdout.lines() {
        assert!(!line.starts_with("ERROR"), "{line}\n{report}");
        if line.starts_with("WARN") {
            // Only the kinds it has no schema for may be skipped; a core object
            // with a mistyped apiVersion would be skipped the same way.
            assert!(
                KINDS_WITHOUT_SCHEMA
                    .iter()
                    .any(|k| line.contains(&format!("schema for kind {k} with"))),
                "an object was not validated: {line}\n{report}"
            );
        }
    }
    for (kind, name) in CORE_OBJECTS {
        let passed = format!("passed for resource {}/{name} ", kind.to_lowercase());
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("INFO") && l.contains(&passed)),
            "{kind} {name} was not validated against the schemas:\n{report}"
        );
    }
}

// ---------------------------------------------------------------------------
// The DaemonSet and its neighbours

#[test]
fn daemonset_runs_the_agent_locked_down_with_probes_and_sized_resources() {
    let ds = object("daemonset.yaml", "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let containers = pod["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 1, "one container, the agent");
    let c = &containers[0];

    // The agent needs ~20 s to stop polling, release its locks and finish scrapes.
    assert_eq!(pod["terminationGracePeriodSeconds"], 30);

    let pod_sc = &pod["securityContext"];
    assert_eq!(pod_sc["runAsNonRoot"], true);
    assert_eq!(pod_sc["runAsUser"], 10001);
    assert_eq!(pod_sc["seccompProfile"]["type"], "RuntimeDefault");
    let sc = &c["securityContext"];
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert!(sc.get("privileged").is_none_or(|p| p == false));
    assert_eq!(pod["automountServiceAccountToken"], false);

    let ports = c["ports"].as_array().expect("ports");
    assert!(
        ports
            .iter()
            .any(|p| p["name"] == "metrics" && p["containerPort"] == 9469),
        "the container exposes 9469 as `metrics`"
    );
    // The probes log in over TLS as the web config file's "kubelet" user.
    let web_config = web_config_of_the_example_secret();
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert_eq!(get["port"], "metrics", "{probe}");
        assert_eq!(get["scheme"], "HTTPS", "{probe}");
        let auth = get["httpHeaders"][0]["value"]
            .as_str()
            .expect("an Authorization header");
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.strip_prefix("Basic ").expect("basic auth"))
            .expect("base64");
        let user = String::from_utf8(decoded).expect("UTF-8");
        let user = user.split(':').next().expect("user:password");
        assert!(
            web_config.contains(&format!("\n  {user}: $2y$")),
            "{probe} logs in as {user}, a user of the web config file:\n{web_config}"
        );
    }

    let res = &c["resources"];
    assert_eq!(res["requests"]["cpu"], "20m");
    assert_eq!(res["requests"]["memory"], "32Mi");
    assert_eq!(res["limits"]["memory"], "128Mi");
    assert!(
        res["limits"].get("cpu").is_none(),
        "no CPU limit: throttling would delay lock renewals"
    );

    // The config file the agent is told to read is the mounted ConfigMap's key,
    // and the web config file the mounted Secret's.
    assert_eq!(
        c["args"],
        serde_json::json!([
            "run",
            "--config",
            "/etc/inboxwatch/inboxwatch.toml",
            "--web.config.file",
            "/etc/inboxwatch/web/web-config.yml"
        ])
    );
    let web_mount = c["volumeMounts"]
        .as_array()
        .expect("volumeMounts")
        .iter()
        .find(|m| m["mountPath"] == "/etc/inboxwatch/web")
        .expect("the web config is mounted at /etc/inboxwatch/web");
    let web_volume = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == web_mount["name"])
        .expect("the mounted web volume");
    let web_secret = object("web-secret.example.yaml", "Secret");
    assert_eq!(
        web_volume["secret"]["secretName"],
        web_secret["metadata"]["name"]
    );
    let projected: BTreeSet<&str> = web_volume["secret"]["items"]
        .as_array()
        .expect("items: only what the agent reads")
        .iter()
        .map(|i| i["key"].as_str().expect("a key"))
        .collect();
    assert_eq!(
        projected,
        BTreeSet::from(["web-config.yml", "tls.crt", "tls.key"])
    );
    for file in ["tls.crt", "tls.key"] {
        assert!(
            web_config.contains(&format!("_file: {file}\n")),
            "{file} in\n{web_config}"
        );
    }
    let mount = c["volumeMounts"]
        .as_array()
        .expect("volumeMounts")
        .iter()
        .find(|m| m["mountPath"] == "/etc/inboxwatch")
        .expect("the config is mounted at /etc/inboxwatch");
    assert_eq!(mount["readOnly"], true);
    let volume = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the mounted volume");
    let configmap = object("configmap.yaml", "ConfigMap");
    assert_eq!(volume["configMap"]["name"], configmap["metadata"]["name"]);
    assert!(configmap["data"]["inboxwatch.toml"].is_string());

    let secret = object("secret.example.yaml", "Secret");
    let env_from = c["envFrom"].as_array().expect("envFrom");
    assert!(
        env_from
            .iter()
            .any(|e| e["secretRef"]["name"] == secret["metadata"]["name"]),
        "the Secret's keys become the agent's environment"
    );
    let account = object("serviceaccount.yaml", "ServiceAccount");
    assert_eq!(pod["serviceAccountName"], account["metadata"]["name"]);

    let selector = &ds["spec"]["selector"]["matchLabels"];
    let labels = &ds["spec"]["template"]["metadata"]["labels"];
    assert_eq!(selector["app.kubernetes.io/name"], "inboxwatch");
    assert_eq!(labels["app.kubernetes.io/name"], "inboxwatch");
}

/// The web config file of `web-secret.example.yaml`.
fn web_config_of_the_example_secret() -> String {
    let secret = object("web-secret.example.yaml", "Secret");
    format!(
        "\n{}",
        secret["stringData"]["web-config.yml"]
            .as_str()
            .expect("web-config.yml")
            .lines()
            .map(|l| format!("{l}\n"))
            .collect::<String>()
    )
}

#[test]
fn service_and_podmonitor_find_the_agents_as_job_inboxwatch() {
    let pod_labels =
        object("daemonset.yaml", "DaemonSet")["spec"]["template"]["metadata"]["labels"].clone();
    let matches_pods = |selector: &Value| {
        let selector = selector.as_object().expect("a label selector");
        !selector.is_empty() && selector.iter().all(|(k, v)| pod_labels[k] == *v)
    };

    let service = object("service.yaml", "Service");
    assert_eq!(service["spec"]["clusterIP"], "None", "headless");
    assert!(matches_pods(&service["spec"]["selector"]));
    let ports = service["spec"]["ports"].as_array().expect("ports");
    assert!(
        ports
            .iter()
            .any(|p| p["name"] == "metrics" && p["port"] == 9469)
    );

    let monitor = object("podmonitor.yaml", "PodMonitor");
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert!(matches_pods(&monitor["spec"]["selector"]["matchLabels"]));
    let endpoints = monitor["spec"]["podMetricsEndpoints"]
        .as_array()
        .expect("podMetricsEndpoints");
    assert_eq!(endpoints.len(), 1);
    assert_eq!(endpoints[0]["port"], "metrics");
    assert_eq!(endpoints[0]["interval"], "15s");
    // Over TLS with basic auth, from the keys of the web Secret.
    let web_secret = object("web-secret.example.yaml", "Secret");
    let keys = web_secret["stringData"].as_object().expect("stringData");
    assert_eq!(endpoints[0]["scheme"], "https");
    let tls = &endpoints[0]["tlsConfig"];
    assert_eq!(tls["serverName"], "inboxwatch");
    let auth = &endpoints[0]["basicAuth"];
    for reference in [&tls["ca"]["secret"], &auth["username"], &auth["password"]] {
        assert_eq!(reference["name"], web_secret["metadata"]["name"]);
        let key = reference["key"].as_str().expect("a key");
        assert!(keys.contains_key(key), "the Secret has no key {key}");
    }
    let user = keys["scrape-username"].as_str().expect("a user");
    assert!(
        web_config_of_the_example_secret().contains(&format!("\n  {user}: $2y$")),
        "Prometheus scrapes as {user}, a user of the web config file"
    );
    // The rules expect job="inboxwatch": the job comes from this pod label.
    let job_label = monitor["spec"]["jobLabel"].as_str().expect("jobLabel");
    assert_eq!(pod_labels[job_label], "inboxwatch");
    assert!(repo_read("alerts/inboxwatch.rules.yml").contains("job=\"inboxwatch\""));
}

#[test]
fn kustomization_applies_every_manifest_but_the_secret_example() {
    let k = object("kustomization.yaml", "Kustomization");
    assert_eq!(k["namespace"], "monitoring");
    let pairs = k["labels"]
        .as_array()
        .expect("labels")
        .iter()
        .map(|l| &l["pairs"]);
    assert!(
        pairs
            .clone()
            .any(|p| p["app.kubernetes.io/name"] == "inboxwatch")
    );
    let resources: BTreeSet<String> = k["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| r.as_str().expect("a file name").to_string())
        .collect();
    let expected: BTreeSet<String> = manifests()
        .into_iter()
        .filter(|n| !NOT_RESOURCES.contains(&n.as_str()))
        .collect();
    assert_eq!(resources, expected);
    let image = &k["images"][0];
    assert_eq!(
        image["name"], "inboxwatch",
        "replaces the DaemonSet's image"
    );
}

#[test]
fn dockerfile_matches_the_daemonset() {
    let ds = object("daemonset.yaml", "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let uid = &pod["securityContext"]["runAsUser"];
    let port = &c["ports"][0]["containerPort"];
    // The image's default command is the one the DaemonSet spells out, but
    // the web config file, which comes from a Kubernetes Secret.
    let mut args = c["args"].as_array().expect("args").clone();
    assert_eq!(args[args.len() - 2], "--web.config.file");
    args.truncate(args.len() - 2);
    let cmd = serde_json::to_string(&args).expect("args as JSON");
    let dockerfile = repo_read("Dockerfile");
    for line in [
        format!("USER {uid}:{uid}"),
        format!("EXPOSE {port}"),
        "ENTRYPOINT [\"inboxwatch\"]".to_string(),
        format!("CMD {}", cmd.replace(",", ", ")),
        "COPY dashboards/ /usr/share/inboxwatch/dashboards/".to_string(),
        "COPY alerts/ /usr/share/inboxwatch/alerts/".to_string(),
        "COPY config/ /usr/share/inboxwatch/config/".to_string(),
    ] {
        assert!(
            dockerfile.lines().any(|l| l.trim() == line),
            "Dockerfile lacks `{line}`"
        );
    }
    let ignore = repo_read(".dockerignore");
    assert!(ignore.lines().any(|l| l.trim() == "target/"));
}
