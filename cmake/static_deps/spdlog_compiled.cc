// spdlog's compiled part as a static library, for MESHRUN_STATIC_DEPS
// builds (cmake/MeshrunStaticDeps.cmake): Debian ships spdlog as a shared
// library only. As with fmt_compiled.cc, meshrun's objects are compiled
// against the shared library's headers and defines (SPDLOG_COMPILED_LIB),
// so only the link differs. The *-inl.h headers hold what spdlog.h and the
// sink headers declare; the sink templates and factories are instantiated
// for the mutexes and factory the declarations default to: the console
// sinks meshrun logs to (the registry's default logger is a colour stdout
// sink, meshrun's own a colour stderr one).
#include <spdlog/common-inl.h>
#include <spdlog/details/backtracer-inl.h>
#include <spdlog/details/log_msg-inl.h>
#include <spdlog/details/log_msg_buffer-inl.h>
#include <spdlog/details/null_mutex.h>
#include <spdlog/details/os-inl.h>
#include <spdlog/details/periodic_worker-inl.h>
#include <spdlog/details/registry-inl.h>
#include <spdlog/details/synchronous_factory.h>
#include <spdlog/logger-inl.h>
#include <spdlog/pattern_formatter-inl.h>
#include <spdlog/sinks/ansicolor_sink-inl.h>
#include <spdlog/sinks/base_sink-inl.h>
#include <spdlog/sinks/sink-inl.h>
#include <spdlog/sinks/stdout_color_sinks-inl.h>
#include <spdlog/spdlog-inl.h>

#include <mutex>

namespace spdlog {
using details::console_mutex;
using details::console_nullmutex;

template class SPDLOG_API sinks::base_sink<std::mutex>;
template class SPDLOG_API sinks::base_sink<details::null_mutex>;

template class SPDLOG_API sinks::ansicolor_sink<console_mutex>;
template class SPDLOG_API sinks::ansicolor_sink<console_nullmutex>;
template class SPDLOG_API sinks::ansicolor_stdout_sink<console_mutex>;
template class SPDLOG_API sinks::ansicolor_stdout_sink<console_nullmutex>;
template class SPDLOG_API sinks::ansicolor_stderr_sink<console_mutex>;
template class SPDLOG_API sinks::ansicolor_stderr_sink<console_nullmutex>;
template SPDLOG_API std::shared_ptr<logger> stdout_color_mt<synchronous_factory>(
    const std::string& logger_name, color_mode mode);
template SPDLOG_API std::shared_ptr<logger> stdout_color_st<synchronous_factory>(
    const std::string& logger_name, color_mode mode);
template SPDLOG_API std::shared_ptr<logger> stderr_color_mt<synchronous_factory>(
    const std::string& logger_name, color_mode mode);
template SPDLOG_API std::shared_ptr<logger> stderr_color_st<synchronous_factory>(
    const std::string& logger_name, color_mode mode);

}  // namespace spdlog
