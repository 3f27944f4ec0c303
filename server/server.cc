#include "server/server.h"

#include <algorithm>
#include <climits>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/build_info.h"
#include "engine/common/dtype.h"
#include "engine/common/log.h"
#include "engine/kv/kv_dtype.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/impl/server_builder_option.h"
#include "grpcpp/impl/server_builder_plugin.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "server/grpc_log_watch.h"
#include "server/http_tls.h"
#include "server/request_parse.h"
#include "server/tls_files.h"

namespace specula {
namespace {

TlsPaths TlsPathsOf(const ServerSection& s) {
  return TlsPaths{s.tls_cert_file, s.tls_key_file, s.tls_client_ca_file};
}

constexpr char kServiceName[] = "specula.v1.Specula";

GeneratorOptions ToGeneratorOptions(const ServerConfig& c) {
  GeneratorOptions o;
  o.device = c.model.device;
  o.cuda_graphs = c.model.cuda_graphs;
  o.dependent_launches = c.model.dependent_launches;
  o.page_size = c.kv_cache.page_size;
  o.kv_cache_tokens = c.kv_cache.capacity_tokens;
  o.kv_dtype = c.kv_cache.dtype;
  o.prefix_cache.cache_sessionless = c.kv_cache.prefix_cache;
  o.prefix_cache.session_ttl = absl::Seconds(c.kv_cache.session_ttl_seconds);
  o.prefix_cache.max_sessions = c.kv_cache.max_sessions;
  o.host_capacity_tokens = HostCapacityTokens(c);
  o.prefill_chunk_tokens = c.scheduler.prefill_chunk_tokens;
  o.solo_prefill_chunk_tokens = c.scheduler.solo_prefill_chunk_tokens;
  o.max_running = c.scheduler.max_running_requests;
  o.threads = c.scheduler.threads;
  // Sparse pages are KV pool pages: page_size above is theirs too (ValidateConfig checked that
  // sparse.page_size, if given, agrees).
  o.sparse = c.sparse.options;
  return o;
}

v1::ModelInfo MakeModelInfo(const ServerConfig& c, const Generator& g) {
  const ModelConfig& m = g.model_config();
  v1::ModelInfo info;
  info.set_model_path(c.model.path);
  info.set_architecture(ArchitectureName(m.architecture));
  info.set_num_layers(static_cast<uint32_t>(m.num_hidden_layers));
  info.set_num_attention_heads(static_cast<uint32_t>(m.num_attention_heads));
  info.set_num_key_value_heads(static_cast<uint32_t>(m.num_key_value_heads));
  info.set_head_dim(static_cast<uint32_t>(m.head_dim));
  info.set_hidden_size(static_cast<uint32_t>(m.hidden_size));
  info.set_vocab_size(static_cast<uint32_t>(m.vocab_size));
  info.set_max_context_tokens(static_cast<uint32_t>(m.max_position_embeddings));
  info.set_dtype(std::string(DTypeName(m.torch_dtype)));
  info.set_device(g.backend_name());
  info.set_kv_cache_dtype(std::string(KvDtypeName(g.kv_dtype())));
  info.set_server_version(std::string(GetBuildInfo().version));
  info.set_server_revision(std::string(GetBuildInfo().revision));
  std::vector<int32_t> eos(g.eos_ids().begin(), g.eos_ids().end());
  std::sort(eos.begin(), eos.end());
  for (int32_t id : eos) info.add_eos_token_ids(static_cast<uint32_t>(id));
  v1::ServerLimits* limits = info.mutable_limits();
  limits->set_max_running_requests(static_cast<uint32_t>(c.scheduler.max_running_requests));
  limits->set_max_waiting_requests(static_cast<uint32_t>(c.scheduler.max_waiting_requests));
  limits->set_max_receive_message_bytes(static_cast<uint32_t>(c.server.max_receive_message_bytes));
  limits->set_kv_cache_tokens(static_cast<uint64_t>(g.kv_pool().num_blocks()) *
                              g.kv_pool().page_size());
  limits->set_prefill_chunk_tokens(static_cast<uint32_t>(c.scheduler.prefill_chunk_tokens));
  const SparseOptions& sp = g.options().sparse;
  v1::SparseConfig* sparse = info.mutable_sparse();
  sparse->set_enabled(sp.enabled);
  sparse->set_budget_tokens(static_cast<uint64_t>(sp.budget_tokens));
  sparse->set_sink_tokens(static_cast<uint32_t>(sp.sink_tokens));
  sparse->set_recent_tokens(static_cast<uint32_t>(sp.recent_tokens));
  sparse->set_selector(sp.selector);
  sparse->set_speculation(SpeculationModeName(sp.speculation));
  sparse->set_miss_policy(MissPolicyName(sp.miss_policy));
  sparse->set_miss_correction(sp.miss_correction);
  sparse->set_min_context_tokens(static_cast<uint64_t>(sp.effective_min_context_tokens()));
  sparse->set_page_size(static_cast<uint32_t>(g.kv_pool().page_size()));
  return info;
}

std::string JoinHostPort(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? absl::StrFormat("[%s]:%d", host, port)
                                             : absl::StrFormat("%s:%d", host, port);
}

}  // namespace

namespace {

// A failed device (a sticky CUDA error at a step's readback) cannot be recovered in-process: the
// engine has failed its requests, and the server takes its fatal path to be restarted.
class DeviceFaultWatch : public EngineObserver {
 public:
  explicit DeviceFaultWatch(Server* server) : server_(server) {}
  void OnDeviceFault(const absl::Status& fault) override {
    server_->ReportFatal("device_fault", std::string(fault.message()));
  }

 private:
  Server* server_;
};

// The model, loaded and logged; errors name the config key that caused them.
absl::StatusOr<std::unique_ptr<Generator>> LoadGenerator(const ServerConfig& config) {
  const absl::Time load_start = absl::Now();
  absl::StatusOr<std::unique_ptr<Generator>> generator =
      Generator::Create(config.model.path, ToGeneratorOptions(config));
  if (!generator.ok()) {
    // Errors an option caused name its config key themselves; the rest are about the model.
    const absl::string_view msg = generator.status().message();
    const bool names_key = absl::StartsWith(msg, "sparse.") || absl::StartsWith(msg, "kv_cache.") ||
                           absl::StartsWith(msg, "scheduler.") ||
                           absl::StartsWith(msg, "model.device:");
    return absl::Status(generator.status().code(),
                        names_key ? std::string(msg) : absl::StrCat("model.path: ", msg));
  }
  const Generator& g = **generator;
  Log(LogLevel::kInfo, "model_loaded",
      {{"path", config.model.path},
       {"architecture", ArchitectureName(g.model_config().architecture)},
       {"layers", g.model_config().num_hidden_layers},
       {"device", g.backend_name()},
       {"kv_cache_tokens",
        static_cast<int64_t>(g.kv_pool().num_blocks()) * g.kv_pool().page_size()},
       {"kv_dtype", std::string(KvDtypeName(g.kv_dtype()))},
       {"sparse", config.sparse.options.enabled},
       {"weights_gb", static_cast<double>(g.model().weights().bytes()) / 1e9},
       {"backend_seconds", g.load_timings().backend_seconds},
       {"weights_seconds", g.load_timings().weights_seconds},
       {"kv_seconds", g.load_timings().kv_seconds},
       {"seconds", absl::ToDoubleSeconds(absl::Now() - load_start)}});
  return generator;
}

// What stops the server before the (possibly long) model load: the configuration, a model
// directory, and TLS files that do not load.
absl::Status CheckBeforeLoad(const ServerConfig& config) {
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  if (config.model.path.empty()) {
    return absl::InvalidArgumentError("model.path: no model directory given");
  }
  if (config.server.tls()) {
    if (absl::StatusOr<TlsFileContents> files = LoadTlsFiles(TlsPathsOf(config.server));
        !files.ok()) {
      return files.status();
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerConfig& config) {
  if (absl::Status s = CheckBeforeLoad(config); !s.ok()) return s;
  RouteProtobufLogs();
  absl::StatusOr<std::unique_ptr<Generator>> generator = LoadGenerator(config);
  if (!generator.ok()) return generator.status();
  // The chat template is checked before anything starts: a template the interpreter cannot run
  // stops the server here, never a request later.
  absl::StatusOr<std::unique_ptr<ChatModel>> chat = ChatModel::Load(
      (*generator)->tokenizer(), config.model.chat_template, config.model.tool_call_parser);
  if (!chat.ok()) return chat.status();
  const v1::ModelInfo model_info = MakeModelInfo(config, **generator);

  std::unique_ptr<Server> s(new Server());
  s->config_ = config;
  s->chat_ = *std::move(chat);
  if (!config.server.auth_token_file.empty()) {
    absl::StatusOr<std::unique_ptr<BearerTokens>> tokens =
        BearerTokens::Load(config.server.auth_token_file);
    if (!tokens.ok()) return tokens.status();
    s->auth_ = *std::move(tokens);
  }
  if (absl::Status st = s->StartMetrics(config); !st.ok()) return st;
  s->device_fault_watch_ = std::make_unique<DeviceFaultWatch>(s.get());
  s->observers_ = std::make_unique<ObserverList>(std::vector<EngineObserver*>{
      s->metrics_.get(), &s->request_log_, s->device_fault_watch_.get()});
  s->sender_ = std::make_unique<SendExecutor>(config.server.send_priority);
  EngineOptions engine_options;
  engine_options.max_waiting = config.scheduler.max_waiting_requests;
  engine_options.max_overtakes = config.scheduler.max_overtakes;
  s->engine_ = std::make_unique<Engine>(*std::move(generator), engine_options, s->observers_.get());

  s->InitCallEnv(config, model_info);
  s->service_ = std::make_unique<SpeculaService>(&s->env_, model_info);
  if (absl::Status st = s->StartGrpc(config); !st.ok()) return st;
  s->StartWatchdog(config);
  if (absl::Status st = s->StartHttp(config, model_info); !st.ok()) {
    s->Shutdown(absl::ZeroDuration());
    return st;
  }
  s->LogListening();
  return s;
}

void Server::LogListening() const {
  Log(LogLevel::kInfo, "server_listening",
      {{"grpc", address_},
       {"metrics", metrics_address_},
       {"http", http_address_},
       {"model", served_model_name_},
       {"chat_template", chat_->has_template()},
       {"auth",
        auth_ == nullptr ? std::string("off") : absl::StrCat(auth_->size(), " bearer tokens")},
       {"tls", !config_.server.tls()                       ? "off"
               : config_.server.tls_client_ca_file.empty() ? "on"
                                                           : "mutual"}});
}

namespace {

// The model's id in the APIs and the metrics: model.name, else the model directory's last
// component.
std::string ServedModelName(const ServerConfig& config) {
  if (!config.model.name.empty()) return config.model.name;
  std::string path = config.model.path;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// server.connections' limits, for both HTTP listeners.
HttpServerOptions HttpConnectionOptions(const ServerSection& s) {
  HttpServerOptions options;
  options.idle_timeout_seconds = s.http_idle_seconds;
  options.stream_stall_seconds = s.http_stream_stall_seconds;
  options.max_connections = s.http_max_connections;
  options.request_read_seconds = s.http_request_read_seconds;
  options.max_connections_per_ip = s.http_max_connections_per_ip;
  return options;
}

}  // namespace

absl::Status Server::StartMetrics(const ServerConfig& config) {
  served_model_name_ = ServedModelName(config);
  metrics_ = std::make_unique<ServerMetrics>(served_model_name_);
  if (config.server.metrics_listen.empty()) return absl::OkStatus();
  metrics_->set_exposer_options(HttpConnectionOptions(config.server));
  if (absl::Status st = metrics_->StartExposer(config.server.metrics_listen); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat("server.metrics_listen: ", st.message()));
  }
  std::string host;
  if (absl::Status st = ParseHostPort(config.server.metrics_listen, &host); !st.ok()) return st;
  metrics_address_ = JoinHostPort(host, metrics_->metrics_port());
  return absl::OkStatus();
}

void Server::InitCallEnv(const ServerConfig& config, const v1::ModelInfo& model_info) {
  // A quarter of the cores: long prompts are rare and the engine wants the rest.
  tokenizer_queue_ = std::make_unique<WorkQueue>(
      std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 4, 1, 8));
  env_.tokenizer_queue = tokenizer_queue_.get();
  env_.max_tokenizing = static_cast<size_t>(config.scheduler.max_tokenizing_requests);
  env_.engine = engine_.get();
  env_.metrics = metrics_.get();
  env_.sender = sender_.get();
  env_.default_max_tokens = config.scheduler.default_max_tokens;
  env_.max_total_tokens.max_prompt_tokens = config.server.max_prompt_tokens;
  env_.max_total_tokens.max_output_tokens = config.server.max_output_tokens;
  env_.chat = chat_.get();
  env_.auth = auth_.get();
  if (config.server.max_requests_per_client > 0) {
    client_limiter_ = std::make_unique<ClientLimiter>(config.server.max_requests_per_client);
    env_.client_limiter = client_limiter_.get();
  }
  env_.max_request_bytes = config.server.max_receive_message_bytes;
  env_.max_total_tokens.dense =
      std::min<int64_t>(model_info.max_context_tokens(), model_info.limits().kv_cache_tokens());
  const Generator& g = engine_->generator();
  if (g.host_pages_capacity() > 0) {
    // host_pages_capacity counts one page per layer and KV head; a request needs one of each.
    const ModelConfig& m = g.model_config();
    const int64_t host_tokens = g.host_pages_capacity() /
                                (int64_t{m.num_hidden_layers} * m.num_key_value_heads) *
                                g.kv_pool().page_size();
    env_.max_total_tokens.sparse = std::min<int64_t>(model_info.max_context_tokens(), host_tokens);
    // UsesSparse reads only what never changes after loading, so gRPC threads may call it.
    env_.max_total_tokens.uses_sparse = [&g](const GenerationRequest& r) {
      return g.UsesSparse(r);
    };
  }
}

namespace {

// gRPC adds the reflection plugin to every builder once its library is loaded (it registers
// itself, process-wide); this option takes it out of one builder.
class WithoutReflection : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    std::erase_if(*plugins, [](const std::unique_ptr<grpc::ServerBuilderPlugin>& p) {
      return p->name() == "proto_server_reflection";
    });
  }
};

int Milliseconds(double seconds) {
  return static_cast<int>(std::min<double>(INT_MAX, seconds * 1000));
}

// server.connections: a client pinging more often than min_ping_interval_seconds (without data
// between) collects a strike per ping; past max_ping_strikes gRPC sends GOAWAY (too_many_pings)
// and closes that connection only. Connections with no call for grpc_max_idle_seconds are closed
// with GOAWAY too (clients reconnect on their next call). A connection on gRPC's TLS listener
// whose handshake has not finished grpc_handshake_seconds after accept is closed (gRPC's default,
// 120 s, lets half-open handshakes pile up memory and descriptors).
void ApplyConnectionLimits(const ServerSection& s, grpc::ServerBuilder& builder) {
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             Milliseconds(s.grpc_handshake_seconds));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             Milliseconds(s.min_ping_interval_seconds));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, s.max_ping_strikes);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, s.ping_without_calls ? 1 : 0);
  if (s.grpc_max_idle_seconds > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                               Milliseconds(s.grpc_max_idle_seconds));
  }
}

// Plaintext, or TLS from server.tls: gRPC's own file watcher re-reads the files every
// reload_seconds (a changed file that does not load keeps the old credentials). Server::Create
// checked the files first: the watcher would only log a bad file and fail every handshake.
std::shared_ptr<grpc::ServerCredentials> GrpcCredentials(const ServerSection& s) {
  if (!s.tls()) return grpc::InsecureServerCredentials();
  const auto refresh = static_cast<unsigned>(s.tls_reload_seconds);
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider =
      s.tls_client_ca_file.empty()
          ? std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                s.tls_key_file, s.tls_cert_file, refresh)
          : std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                s.tls_key_file, s.tls_cert_file, s.tls_client_ca_file, refresh);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (!s.tls_client_ca_file.empty()) {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

}  // namespace

absl::Status Server::StartGrpc(const ServerConfig& config) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // Reflection lists the API's schema to any client, with or without a token: only when
  // server.reflection asks.
  if (!config.server.reflection) builder.SetOption(std::make_unique<WithoutReflection>());
  int port = 0;
  if (config.server.tls()) {
    builder.AddListeningPort(config.server.listen, GrpcCredentials(config.server), &port);
  } else {
    // Plaintext: specula's own listener hands connections to gRPC (grpc_acceptor.h).
    absl::StatusOr<std::unique_ptr<GrpcAcceptor>> acceptor =
        GrpcAcceptor::Listen(config.server.listen);
    if (!acceptor.ok()) {
      engine_->Shutdown(absl::UnavailableError("startup failed"));
      return acceptor.status();
    }
    grpc_acceptor_ = *std::move(acceptor);
    port = grpc_acceptor_->port();
  }
  // Twice our limit, so requests between the two reach CheckAdmission and get INVALID_ARGUMENT
  // naming the key; beyond that gRPC itself answers RESOURCE_EXHAUSTED without buffering them.
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(std::min<int64_t>(INT_MAX, 2 * config.server.max_receive_message_bytes)));
  // A second daemon on the same port must fail to start, not silently share the connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Find clients that vanished without closing (their streams would otherwise generate until
  // max_tokens for nobody): ping idle connections every 60 s, give up after 20 s.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 60 * 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20 * 1000);
  ApplyConnectionLimits(config.server, builder);
  builder.RegisterService(service_.get());
  grpc_server_ = builder.BuildAndStart();
  if (grpc_server_ == nullptr || port == 0) {
    engine_->Shutdown(absl::UnavailableError("startup failed"));
    return absl::UnavailableError(absl::StrFormat(
        "server.listen: cannot listen on %s (address in use or not local?)", config.server.listen));
  }
  std::string host;
  if (absl::Status st = ParseHostPort(config.server.listen, &host); !st.ok()) return st;
  address_ = JoinHostPort(host, port);
  if (grpc_acceptor_ != nullptr) {
    GrpcAcceptor::Options options;
    options.descriptor_ceiling = GrpcAcceptor::DefaultDescriptorCeiling();
    options.max_connections = config.server.grpc_max_connections;
    ServerMetrics* m = metrics_.get();
    options.on_refused = [m](const char* reason) { m->RecordGrpcConnectionRefused(reason); };
    options.on_accept_error = [m] { m->RecordGrpcConnectionRefused("accept_failed"); };
    grpc_acceptor_->Start(grpc_server_.get(), std::move(options));
  } else {
    // gRPC's own TLS listener never accepts again after a failed accept: fatal.
    WatchGrpcLogs(
        [this](const std::string& message) { ReportFatal("grpc_listener_failed", message); });
  }
  grpc_server_->GetHealthCheckService()->SetServingStatus(kServiceName, true);
  grpc_server_->GetHealthCheckService()->SetServingStatus("", true);
  return absl::OkStatus();
}

void Server::ReportFatal(const std::string& cause, const std::string& error) {
  std::function<void()> handler;
  {
    std::lock_guard lock(fatal_mu_);
    const bool first = fatal_cause_.empty();
    Log(LogLevel::kError, "fatal",
        {{"cause", cause},
         {"error", error},
         {"action", first ? "health NOT_SERVING; ending in-flight requests; exiting with status 1"
                          : "already failing"}});
    if (!first) return;
    fatal_cause_ = cause;
    metrics_->RecordFatal(cause);
    env_.failing.store(true);
    handler = fatal_handler_;
  }
  if (handler) handler();
}

void Server::SetFatalHandler(std::function<void()> handler) {
  bool already;
  {
    std::lock_guard lock(fatal_mu_);
    fatal_handler_ = handler;
    already = !fatal_cause_.empty();
  }
  if (already && handler) handler();
}

absl::Status Server::StartHttp(const ServerConfig& config, const v1::ModelInfo& model_info) {
  if (config.server.http_listen.empty()) return absl::OkStatus();
  responses_ = std::make_unique<ResponseStore>(config.server.responses_max_stored,
                                               absl::Seconds(config.server.responses_ttl_seconds));
  openai_ = std::make_unique<OpenAiService>(&env_, served_model_name_,
                                            model_info.max_context_tokens(), responses_.get());
  HttpServerOptions options = HttpConnectionOptions(config.server);
  if (config.server.tls()) {
    absl::StatusOr<std::unique_ptr<HttpTls>> tls =
        HttpTls::Create(TlsPathsOf(config.server), absl::Seconds(config.server.tls_reload_seconds));
    if (!tls.ok()) return tls.status();
    options.tls = *std::move(tls);
  }
  options.max_body_bytes = static_cast<size_t>(config.server.http_max_body_bytes);
  options.on_refused = [metrics = metrics_.get()](std::string_view reason) {
    metrics->RecordHttpRefused("openai", reason);
  };
  options.on_answered = [metrics = metrics_.get()](std::string_view route, int status) {
    metrics->RecordHttpRequest("openai", route, status);
  };
  options.error_response = &OpenAiService::ErrorResponse;
  options.authenticate = [service = openai_.get()](const HttpRequest& r) {
    return service->Authenticate(r);
  };
  options.open_paths = OpenAiService::OpenPaths();
  options.threads = 2;
  absl::StatusOr<std::unique_ptr<HttpServer>> http =
      HttpServer::Start(config.server.http_listen, openai_->Routes(), options);
  if (!http.ok()) {
    return absl::Status(http.status().code(),
                        absl::StrCat("server.http_listen: ", http.status().message()));
  }
  http_server_ = *std::move(http);
  std::string host;
  if (absl::Status st = ParseHostPort(config.server.http_listen, &host); !st.ok()) return st;
  http_address_ = JoinHostPort(host, http_server_->port());
  return absl::OkStatus();
}

void Server::StartWatchdog(const ServerConfig& config) {
  if (config.server.stall_seconds <= 0) return;
  watchdog_ = std::make_unique<Watchdog>(
      *engine_, absl::Seconds(config.server.stall_seconds), [this](bool stalled) {
        env_.stalled.store(stalled);
        // Both health services: orchestrators probe "" and load balancers the API's name.
        grpc_server_->GetHealthCheckService()->SetServingStatus(kServiceName, !stalled);
        grpc_server_->GetHealthCheckService()->SetServingStatus("", !stalled);
      });
}

absl::Status Server::ReloadAuthTokens() {
  if (auth_ == nullptr) return absl::OkStatus();
  return auth_->Reload();
}

int Server::Shutdown(absl::Duration grace) {
  std::lock_guard lock(shutdown_mu_);
  if (shut_down_) return 0;
  shut_down_ = true;
  watchdog_.reset();  // it must not turn health back to SERVING during the drain
  const absl::Time deadline = absl::Now() + grace;
  env_.draining.store(true);
  grpc_server_->GetHealthCheckService()->SetServingStatus(false);
  // Calls accepted before the drain whose prompts are still being tokenized reach the engine
  // before it stops accepting; new calls are refused by the draining flag meanwhile, and one that
  // passed that check just before it is refused by the closed queue.
  tokenizer_queue_->Close();
  const size_t tokenizing = tokenizer_queue_->outstanding();
  tokenizer_queue_->WaitIdle(deadline);
  engine_->StopAccepting();
  const EngineLoad load = engine_->load();
  Log(LogLevel::kInfo, "draining",
      {{"running", load.running},
       {"waiting", load.waiting},
       {"were_tokenizing", static_cast<int64_t>(tokenizing)},
       {"grace_seconds", absl::ToDoubleSeconds(grace)}});
  int cut_off = 0;
  if (!engine_->WaitIdle(deadline)) {
    const EngineLoad left = engine_->load();
    cut_off = left.running + left.waiting;
    Log(LogLevel::kWarning, "grace_expired", {{"cancelled_requests", cut_off}});
  }
  std::string cause;
  {
    std::lock_guard fatal_lock(fatal_mu_);
    cause = fatal_cause_;
  }
  engine_->Shutdown(absl::UnavailableError(
      cause.empty()
          ? "the server shut down before the request finished (server.shutdown_grace_seconds)"
          : absl::StrCat("the server failed (", cause, ") and restarts; retry")));
  // Every Generate call finishes as its stream closes; Watch streams of health are cut at once.
  if (grpc_acceptor_ != nullptr) grpc_acceptor_->Stop();
  grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  // Every HTTP request has its answer (the engine closed all streams); the listener closes the
  // connections. Its tasks on the send executor hold only weak references.
  http_server_.reset();
  Log(LogLevel::kInfo, "stopped", {{"cancelled_requests", cut_off}});
  return cut_off;
}

Server::~Server() {
  if (grpc_server_ != nullptr) Shutdown(absl::ZeroDuration());
  if (grpc_acceptor_ == nullptr) StopWatchingGrpcLogs();  // its handler points here
}

}  // namespace specula
