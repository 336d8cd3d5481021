// expect: error: .*locus: with_device needs the callable to return the same type for cpu and cuda
// Rule: the body given to with_device is instantiated for every compiled-in device, so
// what it returns may not depend on the device (a tensor<float, cuda, 1> is not a
// tensor<float, cpu, 1>).
#include <locus/locus.hpp>

double total(locus::device_choice choice) {
#ifdef LOCUS_VIOLATION
  auto t = locus::with_device(choice, [](auto dev) {
    return locus::zeros<float, decltype(dev)>({3});
  });
  return static_cast<double>(t.numel());
#else
  return locus::with_device(choice, [](auto dev) {
    auto t = locus::zeros<float, decltype(dev)>({3});
    return static_cast<double>(t.numel());
  });
#endif
}
