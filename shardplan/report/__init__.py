"""Pictures and reports of a plan (matplotlib with the Agg backend; Graphviz when installed).

- :func:`timeline_png`: the simulated pipeline as a Gantt chart (device x time);
- :func:`graph_png`: the partitioned graph, stages as boxes (paper 000, Figure 2);
- :func:`bandwidth_png`: the topology's bandwidth matrix with the mapping drawn on it;
- :func:`write_report`: all three with the plan's numbers in one self-contained HTML file.

matplotlib is imported only when a picture is drawn.
"""

from shardplan.report._bandwidth import bandwidth_figure, bandwidth_png
from shardplan.report._graph import graph_figure, graph_png, graphviz_png
from shardplan.report._html import report_html, write_report
from shardplan.report._timeline import timeline_figure, timeline_png

__all__ = ["bandwidth_figure", "bandwidth_png", "graph_figure", "graph_png", "graphviz_png",
           "report_html", "timeline_figure", "timeline_png", "write_report"]
