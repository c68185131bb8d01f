// loss_plot_svg: training and validation loss against step for one or more
// runs, as a self-contained SVG (what `fdtrain plot` writes), so that the runs
// of a sweep can be compared at a glance.
//
// Linear axes with "nice" ticks (1, 2, 5 x 10^k) and labels; one colour per
// run (a 10-colour palette, reused after ten runs); the training loss solid,
// the validation loss dashed with a marker at each evaluation; a legend with
// the run names. Each series is one <polyline> carrying class="train" or
// class="eval" and data-run="<name>", so that tests and scripts can find it.
#pragma once

#include <string>
#include <vector>

#include "lib/engine/run_table.h"

namespace fd::engine {

struct PlotOptions {
  int width = 960;   // pixels
  int height = 540;  // pixels
  std::string title = "loss";
};

// Throws fd::Error (usage) when no run has a single loss value to draw.
std::string loss_plot_svg(const std::vector<RunRecord>& runs, const PlotOptions& options = {});

}  // namespace fd::engine
