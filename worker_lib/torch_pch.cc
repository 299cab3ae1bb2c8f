// Nothing of its own: meshrun_torch_pch exists to precompile libtorch's
// headers once with meshrun_worker's flags, for the programs and tests built
// on the library (worker_lib/CMakeLists.txt, meshrun_reuse_torch_pch).
