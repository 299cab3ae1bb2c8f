#!/usr/bin/env bash
# Draws a train_text loss log (CSV: attempt,step,loss,val_loss,seconds,
# replicas) as a PNG with gnuplot: training loss per step for each attempt,
# validation loss, and where a worker was killed and where training resumed
# (fault-tolerant: the steps trained by fewer replicas, and where the failed
# one was back).
#
#   bash scripts/lib/plot-loss.sh runs/x/loss.csv runs/x/loss.png
set -euo pipefail
csv=$1
png=$2
command -v gnuplot > /dev/null ||
  { echo "plot-loss: gnuplot is missing (scripts/install-deps.sh installs gnuplot-nox)" >&2; exit 1; }
[ -s "$csv" ] || { echo "plot-loss: no loss log at $csv" >&2; exit 1; }
# The last step the first attempt finished, and the step the next one resumed
# after (its first step - 1): the failure and the resume.
read -r failed resumed < <(awk -F, 'NR > 1 && $1 == 0 { last0 = $2 }
  NR > 1 && $1 == 1 && first1 == "" { first1 = $2 }
  END { print (last0 == "" ? -1 : last0), (first1 == "" ? -1 : first1 - 1) }' "$csv")
attempts=$(awk -F, 'NR > 1 { a[$1] = 1 } END { print length(a) }' "$csv")
# Fault-tolerant runs: the last step before one trained by fewer replicas
# than the most, and the last before all of them trained again (-1: never),
# and where the shading of those steps ends.
read -r degraded healed shade_end < <(awk -F, 'NR > 1 && $6 != "" { r[NR] = $6; s[NR] = $2; if ($6 > most) most = $6 }
  END { d = -1; h = -1
        for (i = 2; i <= NR; i++) {
          if (d < 0 && r[i] < most) d = s[i] - 1
          else if (d >= 0 && h < 0 && r[i] == most) h = s[i] - 1
        }
        print d, h, (h >= 0 ? h : s[NR]) }' "$csv")
{
  echo "set terminal pngcairo size 900,500 font 'sans,10'"
  echo "set output '$png'"
  echo "set datafile separator ','"
  echo "set title 'meshrun main job: character-level GPT on fortunes, dp=2 x tp=2, 4 workers'"
  echo "set xlabel 'step'; set ylabel 'cross-entropy (nats per character)'"
  echo "set grid; set key top right"
  if [ "$degraded" -ge 0 ]; then
    echo "set title 'meshrun main job: character-level GPT on fortunes, 2 fault-tolerant replicas x tp=2, 4 workers'"
    echo "set object 1 rect from $degraded, graph 0 to $shade_end, graph 1 fc rgb '#ffdddd' fs solid 0.5 noborder behind"
    echo "set label 'a worker killed after step $degraded: its replica restarts, the other trains on' at $degraded, graph 0.95 right offset -0.5,0 tc rgb 'red'"
    if [ "$healed" -ge 0 ]; then
      echo "set label 'healed from the live replica: both train again from step $(( healed + 1 ))' at $healed, graph 0.88 right offset -0.5,0 tc rgb 'dark-green'"
    fi
  fi
  if [ "$attempts" -gt 1 ]; then
    echo "set arrow from $failed, graph 0 to $failed, graph 1 nohead lc rgb 'red' dt 2 lw 2"
    echo "set label 'worker killed after step $failed' at $failed, graph 0.95 right offset -0.5,0 tc rgb 'red'"
    echo "set arrow from $resumed, graph 0 to $resumed, graph 0.85 nohead lc rgb 'dark-green' dt 3 lw 2"
    echo "set label 'resumed from the checkpoint of step $resumed' at $resumed, graph 0.88 right offset -0.5,0 tc rgb 'dark-green'"
  fi
  first="train (first attempt)"
  [ "$attempts" -gt 1 ] || first="train"
  plots="'$csv' using (\$1 == 0 ? \$2 : 1/0):3 skip 1 with lines lc rgb '#1f77b4' title '$first'"
  if [ "$attempts" -gt 1 ]; then
    plots+=", '' using (\$1 > 0 ? \$2 : 1/0):3 skip 1 with lines lc rgb '#ff7f0e' title 'train (after the restart)'"
  fi
  plots+=", '' using 2:(strlen(strcol(4)) > 0 ? \$4 : 1/0) skip 1 with linespoints pt 7 ps 0.8 lc rgb 'black' title 'validation'"
  echo "plot $plots"
} | gnuplot
[ -s "$png" ] || { echo "plot-loss: gnuplot wrote no $png" >&2; exit 1; }
