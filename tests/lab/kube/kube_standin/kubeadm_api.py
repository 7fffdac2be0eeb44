"""The configuration kinds kubeadm 1.36 reads, as typed field tables, and a strict decoder.

kubeadm decodes each YAML document of ``--config`` into Go structs (sigs.k8s.io/yaml: YAML -> JSON ->
encoding/json). A value of the wrong JSON type is an error (``json: cannot unmarshal string into Go
struct field ... of type int32``); a field the struct does not have is reported by the strict decoder
(``strict decoding error: unknown field "..."``), which ``kubeadm init``/``join`` print as a warning and
``kubeadm config validate`` turns into an error.

The tables follow the Go types of kubeadm.k8s.io/v1beta4, kubelet.config.k8s.io/v1beta1 and
kubeproxy.config.k8s.io/v1alpha1 as published in the Kubernetes API references. They cover the fields
this project's roles render and the commonly used ones; a field missing here is reported as unknown,
so a stand-in gap shows up as a loud warning/error, never as a silently accepted typo.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# Leaf types: the Go type name kubeadm's error would print, and the JSON types it accepts.
STR = "string"
INT32 = "int32"
INT64 = "int64"
BOOL = "bool"
FLOAT = "float64"
DURATION = "v1.Duration"  # metav1.Duration: a Go duration string such as "10s"
TIME = "v1.Time"  # RFC 3339 string


def list_of(item: Any, go_name: str = "") -> dict[str, Any]:
    return {"__list__": item, "__go__": go_name}


def map_of(value: Any, go_name: str = "") -> dict[str, Any]:
    return {"__map__": value, "__go__": go_name}


def struct(go_name: str, **fields: Any) -> dict[str, Any]:
    return {"__struct__": go_name, **fields}


# ----------------------------------------------------------------------------------------------------
# kubeadm.k8s.io/v1beta4
# ----------------------------------------------------------------------------------------------------
ARG = struct("v1beta4.Arg", name=STR, value=STR)
ARGS = list_of(ARG, "[]v1beta4.Arg")
ENV = struct("v1beta4.EnvVar", name=STR, value=STR, valueFrom=map_of(Any, "*v1.EnvVarSource"))
ENVS = list_of(ENV, "[]v1beta4.EnvVar")
HOST_PATH_MOUNT = struct(
    "v1beta4.HostPathMount", name=STR, hostPath=STR, mountPath=STR, readOnly=BOOL, pathType=STR
)
CONTROL_PLANE_COMPONENT = dict(
    extraArgs=ARGS, extraVolumes=list_of(HOST_PATH_MOUNT, "[]v1beta4.HostPathMount"), extraEnvs=ENVS
)
TAINT = struct("v1.Taint", key=STR, value=STR, effect=STR, timeAdded=TIME)
NODE_REGISTRATION = struct(
    "v1beta4.NodeRegistrationOptions",
    name=STR,
    criSocket=STR,
    taints=list_of(TAINT, "[]v1.Taint"),
    kubeletExtraArgs=ARGS,
    ignorePreflightErrors=list_of(STR, "[]string"),
    imagePullPolicy=STR,
    imagePullSerial=BOOL,
)
API_ENDPOINT = struct("v1beta4.APIEndpoint", advertiseAddress=STR, bindPort=INT32)
TIMEOUTS = struct(
    "v1beta4.Timeouts",
    controlPlaneComponentHealthCheck=DURATION,
    kubeletHealthCheck=DURATION,
    kubernetesAPICall=DURATION,
    etcdAPICall=DURATION,
    tlsBootstrap=DURATION,
    discovery=DURATION,
    upgradeManifests=DURATION,
)
PATCHES = struct("v1beta4.Patches", directory=STR)
BOOTSTRAP_TOKEN = struct(
    "v1beta4.BootstrapToken",
    token=STR,
    description=STR,
    ttl=DURATION,
    expires=TIME,
    usages=list_of(STR, "[]string"),
    groups=list_of(STR, "[]string"),
)
META = dict(apiVersion=STR, kind=STR)

INIT_CONFIGURATION = struct(
    "InitConfiguration",
    **META,
    bootstrapTokens=list_of(BOOTSTRAP_TOKEN, "[]v1beta4.BootstrapToken"),
    dryRun=BOOL,
    nodeRegistration=NODE_REGISTRATION,
    localAPIEndpoint=API_ENDPOINT,
    certificateKey=STR,
    skipPhases=list_of(STR, "[]string"),
    patches=PATCHES,
    timeouts=TIMEOUTS,
)

CLUSTER_CONFIGURATION = struct(
    "ClusterConfiguration",
    **META,
    etcd=struct(
        "v1beta4.Etcd",
        local=struct(
            "v1beta4.LocalEtcd",
            imageRepository=STR,
            imageTag=STR,
            dataDir=STR,
            extraArgs=ARGS,
            extraEnvs=ENVS,
            serverCertSANs=list_of(STR, "[]string"),
            peerCertSANs=list_of(STR, "[]string"),
        ),
        external=struct(
            "v1beta4.ExternalEtcd",
            endpoints=list_of(STR, "[]string"),
            caFile=STR,
            certFile=STR,
            keyFile=STR,
        ),
    ),
    networking=struct("v1beta4.Networking", serviceSubnet=STR, podSubnet=STR, dnsDomain=STR),
    kubernetesVersion=STR,
    controlPlaneEndpoint=STR,
    apiServer=struct("v1beta4.APIServer", **CONTROL_PLANE_COMPONENT, certSANs=list_of(STR, "[]string")),
    controllerManager=struct("v1beta4.ControlPlaneComponent", **CONTROL_PLANE_COMPONENT),
    scheduler=struct("v1beta4.ControlPlaneComponent", **CONTROL_PLANE_COMPONENT),
    dns=struct("v1beta4.DNS", disabled=BOOL, imageRepository=STR, imageTag=STR),
    proxy=struct("v1beta4.Proxy", disabled=BOOL),
    certificatesDir=STR,
    imageRepository=STR,
    featureGates=map_of(BOOL, "map[string]bool"),
    clusterName=STR,
    encryptionAlgorithm=STR,
    certificateValidityPeriod=DURATION,
    caCertificateValidityPeriod=DURATION,
)

JOIN_CONFIGURATION = struct(
    "JoinConfiguration",
    **META,
    dryRun=BOOL,
    nodeRegistration=NODE_REGISTRATION,
    caCertPath=STR,
    discovery=struct(
        "v1beta4.Discovery",
        bootstrapToken=struct(
            "v1beta4.BootstrapTokenDiscovery",
            token=STR,
            apiServerEndpoint=STR,
            caCertHashes=list_of(STR, "[]string"),
            unsafeSkipCAVerification=BOOL,
        ),
        file=struct(
            "v1beta4.FileDiscovery", kubeConfigPath=STR, kubeConfig=map_of(Any, "*v1beta4.Kubeconfig")
        ),
        tlsBootstrapToken=STR,
    ),
    controlPlane=struct("v1beta4.JoinControlPlane", localAPIEndpoint=API_ENDPOINT, certificateKey=STR),
    skipPhases=list_of(STR, "[]string"),
    patches=PATCHES,
    timeouts=TIMEOUTS,
)

RESET_CONFIGURATION = struct(
    "ResetConfiguration",
    **META,
    cleanupTmpDir=BOOL,
    certificatesDir=STR,
    criSocket=STR,
    dryRun=BOOL,
    force=BOOL,
    ignorePreflightErrors=list_of(STR, "[]string"),
    skipPhases=list_of(STR, "[]string"),
    unmountFlags=list_of(STR, "[]string"),
    timeouts=TIMEOUTS,
)

# ----------------------------------------------------------------------------------------------------
# kubelet.config.k8s.io/v1beta1 KubeletConfiguration
# ----------------------------------------------------------------------------------------------------
STRS = list_of(STR, "[]string")
STR_MAP = map_of(STR, "map[string]string")
LOGGING = struct(
    "v1.LoggingConfiguration",
    format=STR,
    flushFrequency=DURATION,
    verbosity=INT32,
    vmodule=list_of(Any, "v1.VModuleConfiguration"),
    options=map_of(Any, "v1.FormatOptions"),
)
KUBELET_CONFIGURATION = struct(
    "KubeletConfiguration",
    **META,
    enableServer=BOOL,
    staticPodPath=STR,
    podLogsDir=STR,
    syncFrequency=DURATION,
    fileCheckFrequency=DURATION,
    httpCheckFrequency=DURATION,
    staticPodURL=STR,
    staticPodURLHeader=map_of(Any, "map[string][]string"),
    address=STR,
    port=INT32,
    readOnlyPort=INT32,
    tlsCertFile=STR,
    tlsPrivateKeyFile=STR,
    tlsCipherSuites=STRS,
    tlsMinVersion=STR,
    rotateCertificates=BOOL,
    serverTLSBootstrap=BOOL,
    authentication=struct(
        "v1beta1.KubeletAuthentication",
        x509=struct("v1beta1.KubeletX509Authentication", clientCAFile=STR),
        webhook=struct("v1beta1.KubeletWebhookAuthentication", enabled=BOOL, cacheTTL=DURATION),
        anonymous=struct("v1beta1.KubeletAnonymousAuthentication", enabled=BOOL),
    ),
    authorization=struct(
        "v1beta1.KubeletAuthorization",
        mode=STR,
        webhook=struct(
            "v1beta1.KubeletWebhookAuthorization", cacheAuthorizedTTL=DURATION, cacheUnauthorizedTTL=DURATION
        ),
    ),
    registryPullQPS=INT32,
    registryBurst=INT32,
    imagePullCredentialsVerificationPolicy=STR,
    preloadedImagesVerificationAllowlist=STRS,
    eventRecordQPS=INT32,
    eventBurst=INT32,
    enableDebuggingHandlers=BOOL,
    enableContentionProfiling=BOOL,
    healthzPort=INT32,
    healthzBindAddress=STR,
    oomScoreAdj=INT32,
    clusterDomain=STR,
    clusterDNS=STRS,
    streamingConnectionIdleTimeout=DURATION,
    nodeStatusUpdateFrequency=DURATION,
    nodeStatusReportFrequency=DURATION,
    nodeLeaseDurationSeconds=INT32,
    imageMinimumGCAge=DURATION,
    imageMaximumGCAge=DURATION,
    imageGCHighThresholdPercent=INT32,
    imageGCLowThresholdPercent=INT32,
    volumeStatsAggPeriod=DURATION,
    kubeletCgroups=STR,
    systemCgroups=STR,
    cgroupRoot=STR,
    cgroupsPerQOS=BOOL,
    cgroupDriver=STR,
    cpuManagerPolicy=STR,
    singleProcessOOMKill=BOOL,
    cpuManagerPolicyOptions=STR_MAP,
    cpuManagerReconcilePeriod=DURATION,
    memoryManagerPolicy=STR,
    topologyManagerPolicy=STR,
    topologyManagerScope=STR,
    topologyManagerPolicyOptions=STR_MAP,
    qosReserved=STR_MAP,
    runtimeRequestTimeout=DURATION,
    hairpinMode=STR,
    maxPods=INT32,
    podCIDR=STR,
    podPidsLimit=INT64,
    resolvConf=STR,
    runOnce=BOOL,
    cpuCFSQuota=BOOL,
    cpuCFSQuotaPeriod=DURATION,
    nodeStatusMaxImages=INT32,
    maxOpenFiles=INT64,
    contentType=STR,
    kubeAPIQPS=INT32,
    kubeAPIBurst=INT32,
    serializeImagePulls=BOOL,
    maxParallelImagePulls=INT32,
    evictionHard=STR_MAP,
    evictionSoft=STR_MAP,
    evictionSoftGracePeriod=STR_MAP,
    evictionPressureTransitionPeriod=DURATION,
    evictionMaxPodGracePeriod=INT32,
    evictionMinimumReclaim=STR_MAP,
    mergeDefaultEvictionSettings=BOOL,
    podsPerCore=INT32,
    enableControllerAttachDetach=BOOL,
    protectKernelDefaults=BOOL,
    makeIPTablesUtilChains=BOOL,
    iptablesMasqueradeBit=INT32,
    iptablesDropBit=INT32,
    featureGates=map_of(BOOL, "map[string]bool"),
    failSwapOn=BOOL,
    memorySwap=struct("v1beta1.MemorySwapConfiguration", swapBehavior=STR),
    containerLogMaxSize=STR,
    containerLogMaxFiles=INT32,
    containerLogMaxWorkers=INT32,
    containerLogMonitorInterval=DURATION,
    configMapAndSecretChangeDetectionStrategy=STR,
    systemReserved=STR_MAP,
    kubeReserved=STR_MAP,
    reservedSystemCPUs=STR,
    showHiddenMetricsForVersion=STR,
    systemReservedCgroup=STR,
    kubeReservedCgroup=STR,
    enforceNodeAllocatable=STRS,
    allowedUnsafeSysctls=STRS,
    volumePluginDir=STR,
    providerID=STR,
    kernelMemcgNotification=BOOL,
    logging=LOGGING,
    enableSystemLogHandler=BOOL,
    enableSystemLogQuery=BOOL,
    shutdownGracePeriod=DURATION,
    shutdownGracePeriodCriticalPods=DURATION,
    shutdownGracePeriodByPodPriority=list_of(
        struct("v1beta1.ShutdownGracePeriodByPodPriority", priority=INT32, shutdownGracePeriodSeconds=INT64),
        "[]v1beta1.ShutdownGracePeriodByPodPriority",
    ),
    crashLoopBackOff=struct("v1beta1.CrashLoopBackOffConfig", maxContainerRestartPeriod=DURATION),
    reservedMemory=list_of(
        struct("v1beta1.MemoryReservation", numaNode=INT32, limits=STR_MAP), "[]v1beta1.MemoryReservation"
    ),
    enableProfilingHandler=BOOL,
    enableDebugFlagsHandler=BOOL,
    seccompDefault=BOOL,
    memoryThrottlingFactor=FLOAT,
    registerWithTaints=list_of(TAINT, "[]v1.Taint"),
    registerNode=BOOL,
    tracing=struct("v1.TracingConfiguration", endpoint=STR, samplingRatePerMillion=INT32),
    localStorageCapacityIsolation=BOOL,
    containerRuntimeEndpoint=STR,
    imageServiceEndpoint=STR,
    failCgroupV1=BOOL,
    userNamespaces=struct("v1beta1.UserNamespaces", idsPerPod=INT64),
)

# ----------------------------------------------------------------------------------------------------
# kubeproxy.config.k8s.io/v1alpha1 KubeProxyConfiguration
# ----------------------------------------------------------------------------------------------------
SYNC = dict(syncPeriod=DURATION, minSyncPeriod=DURATION)
KUBE_PROXY_CONFIGURATION = struct(
    "KubeProxyConfiguration",
    **META,
    featureGates=map_of(BOOL, "map[string]bool"),
    clientConnection=struct(
        "v1alpha1.ClientConnectionConfiguration",
        kubeconfig=STR,
        acceptContentTypes=STR,
        contentType=STR,
        qps=FLOAT,
        burst=INT32,
    ),
    logging=LOGGING,
    hostnameOverride=STR,
    bindAddress=STR,
    healthzBindAddress=STR,
    metricsBindAddress=STR,
    bindAddressHardFail=BOOL,
    enableProfiling=BOOL,
    showHiddenMetricsForVersion=STR,
    mode=STR,
    iptables=struct(
        "v1alpha1.KubeProxyIPTablesConfiguration",
        masqueradeBit=INT32,
        masqueradeAll=BOOL,
        localhostNodePorts=BOOL,
        **SYNC,
    ),
    ipvs=struct(
        "v1alpha1.KubeProxyIPVSConfiguration",
        **SYNC,
        scheduler=STR,
        excludeCIDRs=STRS,
        strictARP=BOOL,
        tcpTimeout=DURATION,
        tcpFinTimeout=DURATION,
        udpTimeout=DURATION,
    ),
    nftables=struct(
        "v1alpha1.KubeProxyNFTablesConfiguration", masqueradeBit=INT32, masqueradeAll=BOOL, **SYNC
    ),
    winkernel=map_of(Any, "v1alpha1.KubeProxyWinkernelConfiguration"),
    detectLocalMode=STR,
    detectLocal=struct("v1alpha1.DetectLocalConfiguration", bridgeInterface=STR, interfaceNamePrefix=STR),
    clusterCIDR=STR,
    nodePortAddresses=STRS,
    oomScoreAdj=INT32,
    conntrack=struct(
        "v1alpha1.KubeProxyConntrackConfiguration",
        maxPerCore=INT32,
        min=INT32,
        tcpEstablishedTimeout=DURATION,
        tcpCloseWaitTimeout=DURATION,
        tcpBeLiberal=BOOL,
        udpTimeout=DURATION,
        udpStreamTimeout=DURATION,
    ),
    configSyncPeriod=DURATION,
    portRange=STR,
    windowsRunAsService=BOOL,
    **SYNC,
)

KUBEADM_API = "kubeadm.k8s.io/v1beta4"
KINDS: dict[tuple[str, str], dict[str, Any]] = {
    (KUBEADM_API, "InitConfiguration"): INIT_CONFIGURATION,
    (KUBEADM_API, "ClusterConfiguration"): CLUSTER_CONFIGURATION,
    (KUBEADM_API, "JoinConfiguration"): JOIN_CONFIGURATION,
    (KUBEADM_API, "ResetConfiguration"): RESET_CONFIGURATION,
    ("kubelet.config.k8s.io/v1beta1", "KubeletConfiguration"): KUBELET_CONFIGURATION,
    ("kubeproxy.config.k8s.io/v1alpha1", "KubeProxyConfiguration"): KUBE_PROXY_CONFIGURATION,
}
OLD_KUBEADM_APIS = ("kubeadm.k8s.io/v1beta1", "kubeadm.k8s.io/v1beta2", "kubeadm.k8s.io/v1beta3")

_DURATION = re.compile(r"^[-+]?(0|(\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))+$")
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


@dataclass
class Decoded:
    documents: dict[str, dict[str, Any]] = field(default_factory=dict)  # kind -> object
    unknown: list[str] = field(default_factory=list)  # strict decoding complaints
    errors: list[str] = field(default_factory=list)  # type and shape errors


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _go_name(spec: Any) -> str:
    if isinstance(spec, str):
        return spec
    if spec is Any:
        return "interface {}"
    if "__struct__" in spec:
        return spec["__struct__"]
    return spec.get("__go__") or "?"


def _check(value: Any, spec: Any, path: str, owner: str, out: Decoded) -> None:
    """Type-check value against spec; unknown fields and type errors go to out."""
    if spec is Any or value is None:  # JSON null leaves a Go field at its zero value
        return
    where = f"Go struct field {owner}.{path}"

    def bad() -> None:
        out.errors.append(f"json: cannot unmarshal {_json_type(value)} into {where} of type {_go_name(spec)}")

    if isinstance(spec, str):
        if spec in (STR, DURATION, TIME):
            if not isinstance(value, str):
                bad()
            elif spec == DURATION and not _DURATION.match(value):
                out.errors.append(f'{path}: time: invalid duration "{value}"')
            elif spec == TIME and not _RFC3339.match(value):
                out.errors.append(f'{path}: parsing time "{value}" as RFC3339: cannot parse')
        elif spec in (INT32, INT64):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                bad()
            elif (isinstance(value, float) and not value.is_integer()) or (
                spec == INT32 and not -(2**31) <= value < 2**31
            ):
                out.errors.append(f"json: cannot unmarshal number {value} into {where} of type {spec}")
        elif (spec == BOOL and not isinstance(value, bool)) or (
            spec == FLOAT and (isinstance(value, bool) or not isinstance(value, (int, float)))
        ):
            bad()
        return
    if "__list__" in spec:
        if not isinstance(value, list):
            bad()
            return
        for i, item in enumerate(value):
            _check(item, spec["__list__"], f"{path}[{i}]", owner, out)
        return
    if "__map__" in spec:
        if not isinstance(value, dict):
            bad()
            return
        for key, item in value.items():
            _check(item, spec["__map__"], f"{path}[{key}]", owner, out)
        return
    if not isinstance(value, dict):
        bad()
        return
    for key, item in value.items():
        sub = f"{path}.{key}" if path else key
        if key not in spec or key.startswith("__"):
            out.unknown.append(f'unknown field "{sub}"')
            continue
        _check(item, spec[key], sub, spec["__struct__"].split(".")[-1] if path else owner, out)


def decode(documents: list[Any], source: str) -> Decoded:
    """Decode the documents of one --config file."""
    out = Decoded()
    for index, doc in enumerate(documents):
        if not isinstance(doc, dict):
            out.errors.append(f"{source}: document {index + 1} is not a YAML mapping")
            continue
        api, kind = doc.get("apiVersion"), doc.get("kind")
        if not api or not kind:
            out.errors.append(f"{source}: document {index + 1}: Object 'Kind' is missing in '{doc}'"[:300])
            continue
        if api in OLD_KUBEADM_APIS:
            out.errors.append(
                f'{source}: {kind}: your configuration file uses an old API spec: "{api}" '
                f'(kind: "{kind}"). Please use kubeadm v1.35 instead and run '
                f"'kubeadm config migrate --old-config old-config-file --new-config new-config-file', "
                f"which will write the new, similar spec using a newer API version."
            )
            continue
        spec = KINDS.get((api, kind))
        if spec is None:
            out.errors.append(f'{source}: no kind "{kind}" is registered for version "{api}"')
            continue
        if kind in out.documents:
            out.errors.append(f"{source}: {kind} appears more than once")
            continue
        before = len(out.unknown)
        _check(doc, spec, "", kind, out)
        # name the kind in strict-decoding complaints, as kubeadm's messages do
        out.unknown[before:] = [
            f"{api}, Kind={kind}: strict decoding error: {u}" for u in out.unknown[before:]
        ]
        out.documents[kind] = doc
    return out
