# Vivarium's R kernel: one R process per code context, started by
# kernels.py inside the sandbox (see its doc for the protocol). Cells are
# evaluated in the global environment, so variables and functions live from
# one cell to the next; each top-level value R would print at its prompt is
# a result (the last one the main result), printed as R prints it. Output,
# messages and warnings are the sandbox's stdout and stderr.
local({
  fds <- as.integer(strsplit(Sys.getenv("VIVARIUM_KERNEL_FDS"), ",")[[1]])
  Sys.unsetenv("VIVARIUM_KERNEL_FDS")
  req <- file(sprintf("/proc/self/fd/%d", fds[1]), open = "r", raw = TRUE)
  evt <- file(sprintf("/proc/self/fd/%d", fds[2]), open = "w", raw = TRUE)
  ack <- file(sprintf("/proc/self/fd/%d", fds[3]), open = "r", raw = TRUE)

  unhex <- function(h) {
    if (nchar(h) == 0) return("")
    s <- rawToChar(as.raw(strtoi(substring(h, seq(1, nchar(h), 2), seq(2, nchar(h), 2)), 16L)))
    Encoding(s) <- "UTF-8"
    s
  }
  json <- function(s) {
    s <- enc2utf8(paste(s, collapse = "\n"))
    s <- gsub("\\", "\\\\", s, fixed = TRUE)
    s <- gsub("\"", "\\\"", s, fixed = TRUE)
    s <- gsub("\n", "\\n", s, fixed = TRUE)
    s <- gsub("\r", "\\r", s, fixed = TRUE)
    s <- gsub("\t", "\\t", s, fixed = TRUE)
    s <- gsub("[\001-\037]", "", s, useBytes = TRUE)
    paste0("\"", s, "\"")
  }
  send <- function(line) {
    flush(stdout())
    flush(stderr())
    writeLines(line, evt, useBytes = TRUE)
    flush(evt)
  }
  send_error <- function(name, value, tb) {
    send(sprintf("{\"type\":\"error\",\"name\":%s,\"value\":%s,\"traceback\":%s}", json(name), json(value), json(tb)))
  }
  show <- function(value, main) {
    text <- paste(utils::capture.output(print(value)), collapse = "\n")
    send(sprintf("{\"type\":\"result\",\"main\":%s,\"data\":{\"text/plain\":%s}}",
                 if (main) "true" else "false", json(text)))
    if (length(readLines(ack, n = 1)) == 0) quit(save = "no", status = 0)
  }

  # Plots: a cell's graphics go to PNG files, one per page, shown as
  # results when the cell ends (the runner reads and removes the files).
  plot_dir <- tempfile("vivarium-plots-")
  options(device = function(...) {
    dir.create(plot_dir, showWarnings = FALSE, mode = "0700")
    grDevices::png(file.path(plot_dir, "plot%03d.png"), width = 7, height = 5, units = "in", res = 100,
                   type = if (capabilities("cairo")) "cairo" else getOption("bitmapType"))
  })
  show_plots <- function() {
    while (grDevices::dev.cur() > 1) grDevices::dev.off()
    for (f in sort(list.files(plot_dir, full.names = TRUE))) {
      send(sprintf("{\"type\":\"result\",\"main\":false,\"data\":{\"text/plain\":\"<Figure>\"},\"files\":{\"image/png\":%s}}",
                   json(f)))
      if (length(readLines(ack, n = 1)) == 0) quit(save = "no", status = 0)
    }
    unlink(plot_dir, recursive = TRUE)
  }

  run_cell <- function(code, env) {
    on.exit(show_plots(), add = TRUE)
    saved <- Sys.getenv(names(env), unset = NA, names = TRUE)
    if (length(env) > 0) do.call(Sys.setenv, as.list(env))
    on.exit({
      for (k in names(saved)) {
        if (is.na(saved[[k]])) Sys.unsetenv(k) else do.call(Sys.setenv, stats::setNames(list(saved[[k]]), k))
      }
    }, add = TRUE)
    exprs <- tryCatch(parse(text = code, keep.source = FALSE), error = function(e) e)
    if (inherits(exprs, "error")) {
      send_error("SyntaxError", conditionMessage(exprs), paste0("Error: ", conditionMessage(exprs), "\n"))
      return(1L)
    }
    shown <- NULL
    for (i in seq_along(exprs)) {
      res <- tryCatch(
        withCallingHandlers(
          withVisible(eval(exprs[[i]], envir = globalenv())),
          warning = function(w) {
            message("Warning message:\n", conditionMessage(w))
            invokeRestart("muffleWarning")
          }),
        error = function(e) e,
        interrupt = function(e) structure(list(message = "the cell was interrupted"), class = c("interrupt", "condition")))
      if (inherits(res, "interrupt")) {
        send_error("KeyboardInterrupt", "", "the r cell was interrupted\n")
        return(1L)
      }
      if (inherits(res, "error")) {
        call <- conditionCall(res)
        top <- is.null(call) || identical(call, quote(eval(exprs[[i]], envir = globalenv())))
        where <- if (top) "" else paste0(" in ", paste(deparse(call), collapse = " "))
        send_error("Error", conditionMessage(res), sprintf("Error%s: %s\n", where, conditionMessage(res)))
        return(1L)
      }
      if (isTRUE(res$visible)) {
        if (!is.null(shown)) show(shown$value, FALSE)
        shown <- res
      }
    }
    if (!is.null(shown)) show(shown$value, TRUE)
    0L
  }

  repeat {
    line <- readLines(req, n = 1, warn = FALSE)
    if (length(line) == 0) break
    parts <- strsplit(trimws(line), " ", fixed = TRUE)[[1]]
    if (length(parts) < 2 || parts[1] != "cell") next
    env <- character(0)
    for (kv in parts[-(1:2)]) {
      at <- regexpr("=", kv, fixed = TRUE)
      if (at > 1) env[unhex(substr(kv, 1, at - 1))] <- unhex(substr(kv, at + 1, nchar(kv)))
    }
    status <- tryCatch(run_cell(unhex(parts[2]), env),
                       interrupt = function(e) {
                         send_error("KeyboardInterrupt", "", "the r cell was interrupted\n")
                         1L
                       })
    send(sprintf("{\"type\":\"done\",\"code\":%d}", status))
  }
  quit(save = "no", status = 0)
})
