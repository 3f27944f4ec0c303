// deploy/kubernetes as a cluster would take it: every kustomization rendered by `kubectl
// kustomize`, every object validated against the Kubernetes schemas (npm kubernetes-models, and
// @kubernetes-models/prometheus-operator for the ServiceMonitor), then the facts that must agree
// across files: probes and Services name ports the container has, Service selectors match the
// pods, the grace period outlasts preStop + the server's drain, the config keys exist, and the
// router hashes on x-session-id to the headless Service of ready pods.
//
// Environment (CTest sets it): SPECULA_SOURCE_DIR, K8S_MODELS_DIR (holding node_modules),
// KUBECTL. Run: node --test <this file>.
import {execFileSync} from 'node:child_process';
import {readFileSync} from 'node:fs';
import {join} from 'node:path';
import {pathToFileURL} from 'node:url';
import {test} from 'node:test';
import assert from 'node:assert/strict';

const SOURCE = process.env.SPECULA_SOURCE_DIR;
const MODULES = join(process.env.K8S_MODELS_DIR, 'node_modules');
const KUBECTL = process.env.KUBECTL || 'kubectl';
const KUSTOMIZATIONS = ['base', 'overlays/gpu'];
const PRE_STOP_SECONDS = 5;
const {parseAllDocuments, parse} = await import(pathToFileURL(join(MODULES, 'yaml/dist/index.js')));

function render(dir) {
  const out = execFileSync(KUBECTL, ['kustomize', join(SOURCE, 'deploy/kubernetes', dir)],
                           {encoding: 'utf8'});
  return parseAllDocuments(out).map((d) => d.toJS());
}

// The kubernetes-models class for an object's apiVersion and kind.
async function modelOf(object) {
  const [group, version] = object.apiVersion.includes('/') ?
      object.apiVersion.split('/') : ['', object.apiVersion];
  const file = group === 'monitoring.coreos.com' ?
      join(MODULES, '@kubernetes-models/prometheus-operator', group, version, `${object.kind}.js`) :
      join(MODULES, 'kubernetes-models', ...(group ? [group] : []), version, `${object.kind}.js`);
  const module = await import(pathToFileURL(file));
  return module[object.kind];
}

async function validate(object) {
  const Model = await modelOf(object);
  new Model(object).validate();
}

const rendered = Object.fromEntries(KUSTOMIZATIONS.map((k) => [k, render(k)]));
const find = (objects, kind, name) =>
  objects.find((o) => o.kind === kind && (name === undefined || o.metadata.name === name));

test('every object of every kustomization is valid against its schema', async () => {
  for (const [dir, objects] of Object.entries(rendered)) {
    assert.ok(objects.length >= 6, `${dir} rendered ${objects.length} objects`);
    for (const o of objects) {
      await assert.doesNotReject(validate(o), `${dir}: ${o.kind}/${o.metadata.name}`);
    }
  }
});

test('the validator rejects a broken object (it is not a no-op)', async () => {
  const deployment = structuredClone(find(rendered.base, 'Deployment', 'specula'));
  deployment.spec.template.spec.containers[0].ports[0].containerPort = 'fifty';
  await assert.rejects(validate(deployment));
  const monitor = structuredClone(find(rendered.base, 'ServiceMonitor'));
  monitor.spec.endpoints = 'metrics';
  await assert.rejects(validate(monitor));
});

test('probes, Services and the ServiceMonitor name ports the server container has', () => {
  for (const [dir, objects] of Object.entries(rendered)) {
    const pod = find(objects, 'Deployment', 'specula').spec.template;
    const container = pod.spec.containers.find((c) => c.name === 'specula');
    const ports = new Map(container.ports.map((p) => [p.name, p.containerPort]));
    // The image's listeners (deploy/docker/Dockerfile's entrypoint).
    assert.deepEqual(Object.fromEntries(ports), {grpc: 50051, http: 8000, metrics: 9400}, dir);
    for (const probe of ['startupProbe', 'readinessProbe', 'livenessProbe']) {
      assert.equal(container[probe].grpc.port, ports.get('grpc'), `${dir} ${probe}`);
    }
    for (const name of ['specula', 'specula-endpoints']) {
      const service = find(objects, 'Service', name);
      for (const [k, v] of Object.entries(service.spec.selector)) {
        assert.equal(pod.metadata.labels[k], v, `${dir}: ${name} selects ${k}=${v}`);
      }
      for (const p of service.spec.ports) assert.ok(ports.has(p.targetPort), `${name} ${p.name}`);
    }
    const monitor = find(objects, 'ServiceMonitor');
    const servicePorts = find(objects, 'Service', 'specula').spec.ports.map((p) => p.name);
    for (const e of monitor.spec.endpoints) assert.ok(servicePorts.includes(e.port), e.port);
  }
});

test('the grace period outlasts the preStop pause and the server\'s drain', () => {
  for (const [dir, objects] of Object.entries(rendered)) {
    const spec = find(objects, 'Deployment', 'specula').spec.template.spec;
    const container = spec.containers.find((c) => c.name === 'specula');
    assert.deepEqual(container.lifecycle.preStop.exec.command, ['sleep', String(PRE_STOP_SECONDS)]);
    const config = parse(find(objects, 'ConfigMap').data['specula.yaml']);
    assert.ok(spec.terminationGracePeriodSeconds >
              PRE_STOP_SECONDS + config.server.shutdown_grace_seconds, dir);
  }
});

test('every config key in the ConfigMaps is one the server knows', () => {
  const known = parse(readFileSync(join(SOURCE, 'deploy/config/specula.yaml'), 'utf8'));
  for (const [dir, objects] of Object.entries(rendered)) {
    const config = parse(find(objects, 'ConfigMap').data['specula.yaml']);
    for (const [section, keys] of Object.entries(config)) {
      assert.ok(section in known, `${dir}: unknown section ${section}`);
      for (const key of Object.keys(keys)) {
        assert.ok(key in known[section], `${dir}: unknown key ${section}.${key}`);
      }
    }
  }
  const gpu = parse(find(rendered['overlays/gpu'], 'ConfigMap').data['specula.yaml']);
  assert.equal(gpu.model.device, 'cuda');
  const limits = find(rendered['overlays/gpu'], 'Deployment', 'specula')
      .spec.template.spec.containers[0].resources.limits;
  assert.equal(limits['nvidia.com/gpu'], 1);
});

test('the router hashes x-session-id onto the ready pods', () => {
  const objects = rendered['overlays/gpu'];
  const configMap = objects.find((o) => o.kind === 'ConfigMap' &&
                                        o.metadata.name.startsWith('specula-router-config'));
  const envoy = parse(configMap.data['envoy-config.yaml']);
  const headless = find(objects, 'Service', 'specula-endpoints');
  assert.equal(headless.spec.clusterIP, 'None');
  assert.equal(headless.spec.publishNotReadyAddresses, false);
  const clusters = new Map(envoy.static_resources.clusters.map((c) => [c.name, c]));
  for (const listener of envoy.static_resources.listeners) {
    const manager = listener.filter_chains[0].filters[0].typed_config;
    for (const host of manager.route_config.virtual_hosts) {
      for (const route of host.routes) {
        assert.deepEqual(route.route.hash_policy, [{header: {header_name: 'x-session-id'}}]);
        const cluster = clusters.get(route.route.cluster);
        assert.equal(cluster.lb_policy, 'RING_HASH', cluster.name);
        const address = cluster.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address;
        assert.equal(address.socket_address.address, headless.metadata.name);
        const port = headless.spec.ports.find((p) => p.port === address.socket_address.port_value);
        assert.ok(port, `${cluster.name} targets a port of ${headless.metadata.name}`);
      }
    }
  }
  const router = find(objects, 'Deployment', 'specula-router');
  const mounted = router.spec.template.spec.volumes[0].configMap.name;
  assert.equal(mounted, configMap.metadata.name);
});
